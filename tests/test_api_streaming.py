"""Server-sent events through a real uvicorn server: framing, finish chunks, [DONE], timeouts (SC-10, SC-14.4).

Fake runner with a small step delay so streams span many engine steps; raw response bytes
are parsed by hand (tests/api_helpers.sse_events checks every event's framing).
"""
from __future__ import annotations

import json
import time
from types import SimpleNamespace

import httpx
import pytest

from api_helpers import (MODEL, LiveServer, assert_error, expected_ids, fake_engine, parse_metrics, running_app,
                         sse_events, sse_json, tokenizer, wait_until)

C = 512


@pytest.fixture(scope="module")
def srv():
    engine = fake_engine(max_model_len=C, num_blocks=257, step_delay=0.004)
    with running_app(engine) as (app, ae), LiveServer(app) as live:
        http = httpx.Client(base_url=live.url, timeout=30)
        f0 = parse_metrics(http.get("/metrics").text)["jaxinfer_kv_blocks_free"]
        yield SimpleNamespace(http=http, url=live.url, engine=engine, f0=f0)
        http.close()


def stream(srv, path, body) -> httpx.Response:
    r = srv.http.post(path, json={"model": MODEL, **body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    return r


def check_stream(chunks: list[dict], obj: str, n: int) -> dict[int, list[dict]]:
    """Common SC-10 invariants; returns the chunks of each choice."""
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == obj for c in chunks)
    by_choice: dict[int, list[dict]] = {}
    for c in chunks:
        for ch in c["choices"]:
            by_choice.setdefault(ch["index"], []).append(ch)
    assert sorted(by_choice) == list(range(n))
    for chs in by_choice.values():
        finals = [i for i, ch in enumerate(chs) if ch["finish_reason"] is not None]
        assert finals == [len(chs) - 1] and chs[-1]["finish_reason"] in ("stop", "length")
    return by_choice


@pytest.mark.parametrize("n", [1, 2])
def test_sc10_completions_stream(srv, n):
    body = {"prompt": "Once upon a time", "max_tokens": 5, "n": n}
    r = stream(srv, "/v1/completions", body)
    assert r.content.endswith(b"data: [DONE]\n\n") and r.content.count(b"[DONE]") == 1
    by_choice = check_stream(sse_json(r.content), "text_completion", n)
    full = srv.http.post("/v1/completions", json={"model": MODEL, **body}).json()
    for i, chs in by_choice.items():
        assert "".join(ch["text"] for ch in chs) == full["choices"][i]["text"]


@pytest.mark.parametrize("n", [1, 2])
def test_sc10_chat_stream(srv, n):
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 5, "n": n}
    r = stream(srv, "/v1/chat/completions", body)
    by_choice = check_stream(sse_json(r.content), "chat.completion.chunk", n)
    full = srv.http.post("/v1/chat/completions", json={"model": MODEL, **body}).json()
    for i, chs in by_choice.items():
        assert chs[0]["delta"] == {"role": "assistant", "content": ""}
        assert all("role" not in ch["delta"] for ch in chs[1:])
        assert "".join(ch["delta"].get("content", "") for ch in chs) == full["choices"][i]["message"]["content"]


def test_stream_usage_chunk(srv):
    r = stream(srv, "/v1/completions", {"prompt": [10, 11], "max_tokens": 4, "n": 2,
                                        "stream_options": {"include_usage": True}})
    chunks = sse_json(r.content)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 8, "total_tokens": 10, "prompt_tokens_details": {"cached_tokens": 0}}
    assert all(c["usage"] is None for c in chunks[:-1])


@pytest.mark.parametrize("prompt_ids,stop", [
    ([185], None),            # starts with UTF-8 continuation bytes: held back, then released
    ([1000], None),
    ([1000], "SPLIT"),        # a stop string that spans tokens (filled in below)
])
def test_streamed_text_equals_non_streamed(srv, prompt_ids, stop):
    tok = tokenizer()
    out = expected_ids(prompt_ids, 40)
    if stop == "SPLIT":
        stop = tok.decode(out[20:22])[1:]
    body = {"prompt": prompt_ids, "max_tokens": 40, "stop": stop}
    full = srv.http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    r = stream(srv, "/v1/completions", body)
    chunks = sse_json(r.content)
    assert "".join(c["choices"][0]["text"] for c in chunks) == full
    expected = tok.decode(out)
    assert full == (expected[: expected.index(stop)] if stop else expected)
    assert len(chunks) > 2  # really streamed


def test_sc10_stream_timeout_error_event_then_done(srv):
    t0 = time.monotonic()
    r = stream(srv, "/v1/completions", {"prompt": "x", "max_tokens": 400, "ignore_eos": True,
                                        "request_timeout": 0.5})
    elapsed = time.monotonic() - t0
    events = sse_events(r.content)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    err = json.loads(events[-2])
    assert set(err) == {"error"} and err["error"]["type"] == "timeout"
    assert all("choices" in json.loads(e) for e in events[:-2])
    assert 0.4 < elapsed < 3
    assert wait_until(lambda: parse_metrics(srv.http.get("/metrics").text)["jaxinfer_kv_blocks_free"] == srv.f0, 2)


def test_sc14_non_stream_timeout_is_504(srv):
    before = parse_metrics(srv.http.get("/metrics").text)["jaxinfer_request_timeouts_total"]
    t0 = time.monotonic()
    r = srv.http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                   "max_tokens": 400, "ignore_eos": True, "request_timeout": 1.0})
    elapsed = time.monotonic() - t0
    err = assert_error(r, 504, type_="timeout")
    assert err["code"] == "request_timeout" and 0.9 < elapsed < 3
    m = parse_metrics(srv.http.get("/metrics").text)
    assert m["jaxinfer_request_timeouts_total"] == before + 1
    assert m["jaxinfer_kv_blocks_free"] == srv.f0 and m["jaxinfer_num_requests_running"] == 0


def test_server_wide_request_timeout():
    with running_app(fake_engine(step_delay=0.004), request_timeout=0.3) as (app, _):
        with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=10) as http:
            r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 200, "ignore_eos": True})
            assert_error(r, 504)
            r = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "request_timeout": 5})
            assert r.status_code == 200  # the per-request value overrides
