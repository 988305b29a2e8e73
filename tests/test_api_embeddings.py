"""``POST /v1/embeddings`` through the official ``openai`` client and raw HTTP, on a fake-runner
engine started as ``--runner pooling`` (tests/fakes.py: each token's fake hidden state is a
function of its id, so every vector is computed by hand): batches, ``dimensions``, base64,
usage, chunked inputs, the 400s, KV blocks back to idle, and the runner split both ways."""
from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient

from api_helpers import MODEL, REFERENCE, assert_error, fake_engine, metric, running_app, tokenizer
from fakes import fake_hidden

C = 128  # max_model_len
CHUNK = 32  # max_num_batched_tokens: longer inputs are computed in chunks


def expected(ids, pooling="last", dims=None, normalize=True) -> np.ndarray:
    h = fake_hidden(ids).astype(np.float64)
    v = h[-1] if pooling == "last" else h.mean(axis=0)
    v = v[:dims] if dims else v
    return v / np.linalg.norm(v) if normalize else v


@pytest.fixture(scope="module")
def api():
    engine = fake_engine(max_model_len=C, num_blocks=129, max_num_batched_tokens=CHUNK, engine_runner="pooling")
    with running_app(engine) as (app, ae):
        http = TestClient(app, raise_server_exceptions=False)
        client = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)
        yield SimpleNamespace(http=http, client=client, engine=engine, f0=metric(http, "jaxinfer_kv_blocks_free"))


def embed(api, **body):
    return api.http.post("/v1/embeddings", json={"model": MODEL, **body})


def assert_idle(api):
    assert metric(api.http, "jaxinfer_kv_blocks_free") == api.f0
    assert metric(api.http, "jaxinfer_num_requests_running") == 0


def test_openai_client_batch_float(api):
    texts = ["The capital of France is", "hello", "a much longer input " * 10]
    r = api.client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    ids = [tokenizer().encode(t) for t in texts]
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == MODEL and r.object == "list"
    for d, toks in zip(r.data, ids):
        np.testing.assert_allclose(d.embedding, expected(toks), rtol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(map(len, ids))
    assert len(ids[2]) > CHUNK  # computed over several steps
    assert_idle(api)


def test_openai_client_default_is_base64_and_decodes(api):
    """The SDK asks for base64 when no format is given and decodes it as little-endian float32."""
    r = api.client.embeddings.create(model=MODEL, input="hello world")
    np.testing.assert_allclose(r.data[0].embedding, expected(tokenizer().encode("hello world")), rtol=1e-6)


def test_openai_client_dimensions_truncate_then_renormalize(api):
    r = api.client.embeddings.create(model=MODEL, input=[[5, 6, 7], [9]], dimensions=3, encoding_format="float")
    for d, toks in zip(r.data, [[5, 6, 7], [9]]):
        assert len(d.embedding) == 3
        np.testing.assert_allclose(d.embedding, expected(toks, dims=3), rtol=1e-6)
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-6


def test_base64_is_little_endian_float32(api):
    r = embed(api, input=[3, 4, 5], encoding_format="base64")
    assert r.status_code == 200, r.text
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    vec = np.frombuffer(raw, "<f4")
    assert vec.shape == (8,)
    np.testing.assert_allclose(vec, expected([3, 4, 5]), rtol=1e-6)


@pytest.mark.parametrize("inp,ids", [([1, 2, 3], [[1, 2, 3]]), ([[1, 2], [3]], [[1, 2], [3]]),
                                     (list(range(10, 10 + C)), [list(range(10, 10 + C))])])
def test_token_id_inputs(api, inp, ids):
    r = embed(api, input=inp)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["data"]) == len(ids)
    for d, toks in zip(body["data"], ids):
        np.testing.assert_allclose(d["embedding"], expected(toks), rtol=1e-6)
    assert body["usage"] == {"prompt_tokens": sum(map(len, ids)), "total_tokens": sum(map(len, ids))}
    assert_idle(api)


def test_normalize_false_and_truncate_prompt_tokens(api):
    r = embed(api, input=list(range(1, 50)), normalize=False, truncate_prompt_tokens=5)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected(list(range(45, 50)), normalize=False))
    assert r.json()["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize("body,param", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": [[]]}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": [[1], []]}, "input"), ({"input": [10**9]}, "input"), ({"input": [-1]}, "input"),
    ({"input": "x", "dimensions": 9}, "dimensions"), ({"input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"), ({"input": 5}, "input"),
    ({"input": list(range(1, C + 2))}, "input"), ({"input": ["a"] * 2049}, "input"),
])
def test_bad_requests_are_400_and_leak_nothing(api, body, param):
    err = assert_error(embed(api, **body), 400)
    assert err["param"] == param or param in err["message"], err
    assert_idle(api)


def test_too_long_input_names_the_limit(api):
    err = assert_error(embed(api, input=list(range(1, C + 2))), 400, "input")
    assert f"limit is {C}" in err["message"] and err["code"] == "context_length_exceeded"


def test_more_inputs_than_the_queue_holds_is_400(api):
    err = assert_error(embed(api, input=[[1]] * 65), 400, "input")  # max_queue_len 64
    assert "65 inputs" in err["message"] and "at most 64 (--max-queue-len)" in err["message"]


def test_pooling_server_refuses_generation(api):
    for path, body in [("/v1/completions", REFERENCE),
                       ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})]:
        err = assert_error(api.http.post(path, json=body), 400, "model")
        assert "--runner pooling" in err["message"] and "/v1/embeddings" in err["message"]
    with pytest.raises(openai.BadRequestError, match="--runner pooling"):
        api.client.completions.create(model=MODEL, prompt="hi", max_tokens=4)


def test_generate_server_refuses_embeddings():
    with running_app(fake_engine()) as (app, ae):
        http = TestClient(app, raise_server_exceptions=False)
        err = assert_error(http.post("/v1/embeddings", json={"model": MODEL, "input": "hi"}), 400, "model")
        assert "--runner pooling" in err["message"]


def test_mean_pooling_over_chunks():
    with running_app(fake_engine(max_num_batched_tokens=CHUNK, engine_runner="pooling",
                                 pooling_type="mean")) as (app, ae):
        http = TestClient(app, raise_server_exceptions=False)
        ids = list(range(7, 7 + 3 * CHUNK + 5))
        r = http.post("/v1/embeddings", json={"model": MODEL, "input": [ids, [4]]})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected(ids, "mean"), rtol=1e-6)
        np.testing.assert_allclose(r.json()["data"][1]["embedding"], expected([4], "mean"), rtol=1e-6)


def test_metrics_count_embedding_requests(api):
    before = metric(api.http, 'jaxinfer_prompt_tokens_total')
    assert embed(api, input=[1, 2, 3, 4]).status_code == 200
    assert metric(api.http, 'jaxinfer_prompt_tokens_total') == before + 4


def test_full_queue_is_429_with_retry_after():
    """Embedding inputs queue like generation requests: a group that does not fit the waiting
    queue now is a 429 with Retry-After; the first group still completes and nothing is held."""
    import asyncio

    from api_helpers import await_until, client

    engine = fake_engine(max_num_seqs=2, max_num_batched_tokens=CHUNK, max_queue_len=4, step_delay=0.05,
                         engine_runner="pooling")
    with running_app(engine) as (app, ae):
        async def scenario():
            async with client(app) as http:
                first = asyncio.create_task(http.post("/v1/embeddings", json={"model": MODEL,
                                                                            "input": [[i] * 90 for i in range(1, 5)]}))
                assert await await_until(lambda: _waiting(engine), 5)
                second = await http.post("/v1/embeddings", json={"model": MODEL, "input": [[1], [2], [3]]})
                return await first, second

        first, second = asyncio.run(scenario())
        assert first.status_code == 200 and len(first.json()["data"]) == 4
        assert_error(second, 429)
        assert float(second.headers["retry-after"]) >= 1
        assert engine.num_free_blocks == engine.num_total_blocks


async def _waiting(engine) -> bool:
    return engine.num_waiting + engine.num_running > 0
