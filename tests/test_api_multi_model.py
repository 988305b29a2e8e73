"""Several models in one server, and graceful degradation to the fallback model.

One shared warm server over two tiny random-config models with the real SmolLM2
tokenizer: "big" and "small" (the fallback) have other weights and other admission
settings, but the same shapes, so the second warm-up finds the first's compiled buckets
in the persistent compilation cache;
plus cheap fake-runner servers for readiness, the chat-template rule and the measured
estimate. A degraded request's output is compared with a direct request to the fallback.
"""
from __future__ import annotations

import asyncio
import copy
import threading

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api_helpers import V, assert_error, client, expected_ids, fake_engine, server_config, tokenizer, wait_until
from fakes import FakeRunner
from helpers import tiny_config
from jaxinfer import LLM
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.entrypoints.openai.degrade import SERVED_BY_HEADER
from jaxinfer.entrypoints.openai.model_registry import ModelRegistry, ServedModel
from jaxinfer.engine.async_engine import AsyncEngine
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params
from jaxinfer.engine.ttft_estimator import TTFTEstimator

SLO = 1.0
PROMPT = "The capital of France is"


class ControlledEstimate(TTFTEstimator):
    """The real estimator, except that `forced` (when set) is the estimate."""

    forced: float | None = None

    def estimate(self, prompt_tokens: int) -> float | None:
        return self.forced if self.forced is not None else super().estimate(prompt_tokens)


def tiny_engine(seed: int, **settings):
    """A warmed-up engine over a tiny random model (few buckets: 4 token sizes x 3 widths)."""
    cfg = tiny_config(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
    return LLM("tiny", model_config=cfg, params=init_params(cfg, scale=5.0, seed=seed), tokenizer=tokenizer(),
               max_model_len=64, block_size=32, max_num_seqs=4, max_num_batched_tokens=8, num_blocks=9,
               use_tqdm=False, **settings).engine


def registry(engines: dict, fallback="small", slo=SLO, **kw) -> ModelRegistry:
    return ModelRegistry([ServedModel(name, AsyncEngine(e)) for name, e in engines.items()],
                         fallback=fallback, degrade_ttft_slo=slo, **kw)


@pytest.fixture(scope="module")
def served():
    models = registry({"big": tiny_engine(1), "small": tiny_engine(2, watermark=0.3, max_queue_len=8)})
    big, small = models.get("big").async_engine, models.get("small").async_engine
    big.ttft, small.ttft = ControlledEstimate(), ControlledEstimate()
    app = create_app(models, server_config(served_model_name="big"))
    models.start()
    assert models.wait_ready()
    compiled = CompileCounter.count
    yield app, big.ttft, small.ttft
    assert CompileCounter.count == compiled, "nothing may compile after warm-up with two models"
    assert big.ttft.pending_tokens == small.ttft.pending_tokens == 0  # every prompt left the estimate
    models.shutdown()


def run(coro):
    return asyncio.run(coro)


async def post(app, path, body):
    async with client(app) as http:
        return await http.post(path, json=body)


def completion(model, **kw):
    return {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **kw}


def series(text: str) -> dict[tuple, float]:
    """Prometheus text -> {(sample name, sorted labels): value}, model_name included."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_models_lists_both_with_their_pools(served):
    app = served[0]
    async def go():
        async with client(app) as http:
            return (await http.get("/v1/models")).json(), (await http.get("/v1/models/small")).json()
    listing, small = run(go())
    cards = {c["id"]: c for c in listing["data"]}
    assert list(cards) == ["big", "small"]
    assert cards["big"]["kv_blocks"] == 8 and cards["small"]["kv_blocks"] == 8  # own pools (null block excluded)
    assert (cards["big"]["fallback"], cards["small"]["fallback"]) == (False, True)
    assert small == cards["small"]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", completion("nope")),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ("/tokenize", {"model": "nope", "prompt": "hi"}),
])
def test_unknown_model_is_404_model_not_found(served, path, body):
    err = assert_error(run(post(served[0], path, body)), 404, param="model")
    assert err["code"] == "model_not_found" and "'big'" in err["message"] and "'small'" in err["message"]


def test_the_model_field_routes_the_request(served):
    app = served[0]
    big, small = (run(post(app, "/v1/completions", completion(m))) for m in ("big", "small"))
    assert (big.json()["model"], big.headers[SERVED_BY_HEADER]) == ("big", "big")
    assert (small.json()["model"], small.headers[SERVED_BY_HEADER]) == ("small", "small")
    assert big.json()["choices"][0]["text"] != small.json()["choices"][0]["text"]  # two different models
    default = run(post(app, "/v1/completions", {k: v for k, v in completion("big").items() if k != "model"}))
    assert default.json()["choices"][0]["text"] == big.json()["choices"][0]["text"]  # no model: the first one


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", completion("big")),
    ("/v1/chat/completions", {"model": "big", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                              "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
])
def test_over_the_slo_a_request_is_served_by_the_fallback_exactly_as_a_direct_one(served, path, body):
    app, estimate, _ = served
    before = series(run(client_get(app, "/metrics")))
    direct = run(post(app, path, {**body, "model": "small"}))
    estimate.forced = 10 * SLO
    try:
        degraded = run(post(app, path, body))
        kept = run(post(app, path, {**body, "allow_fallback": False}))
        streamed = run(post(app, path, {**body, "stream": True}))
    finally:
        estimate.forced = None
    within = run(post(app, path, body))
    assert degraded.status_code == 200, degraded.text
    assert (degraded.json()["model"], degraded.headers[SERVED_BY_HEADER]) == ("small", "small")
    assert degraded.json()["choices"] == direct.json()["choices"]
    assert streamed.headers[SERVED_BY_HEADER] == "small" and '"model":"small"' in streamed.text.replace(" ", "")
    assert (kept.json()["model"], kept.headers[SERVED_BY_HEADER]) == ("big", "big")  # allow_fallback: false
    assert kept.json()["choices"] == within.json()["choices"] != direct.json()["choices"]
    after = series(run(client_get(app, "/metrics")))
    key = ("jaxinfer_requests_degraded_total", (("fallback", "small"), ("model_name", "big")))
    assert after[key] - before[key] == 2  # the JSON and the streamed one


def test_within_the_slo_without_an_estimate_or_to_a_busier_fallback_nothing_moves(served):
    app, estimate, fallback = served
    for forced, there in ((None, None), (SLO / 2, None), (10 * SLO, 20 * SLO)):  # None: as measured (idle)
        estimate.forced, fallback.forced = forced, there
        try:
            r = run(post(app, "/v1/completions", completion("big")))
        finally:
            estimate.forced = fallback.forced = None
        assert r.headers[SERVED_BY_HEADER] == "big"


def test_metrics_carry_one_series_set_per_model(served):
    app = served[0]
    run(post(app, "/v1/completions", completion("small")))
    text = run(client_get(app, "/metrics"))
    s = series(text)
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a family's # TYPE twice (one block per model)"
    for model in ("big", "small"):
        assert s[("jaxinfer_kv_blocks_total", (("model_name", model),))] == 8
        assert s[("jaxinfer_engine_healthy", (("model_name", model),))] == 1
        assert s[("jaxinfer_time_to_first_token_seconds_count", (("model_name", model),))] >= 1


async def client_get(app, path):
    async with client(app) as http:
        return (await http.get(path)).text


# ----- cheap fake-runner servers ------------------------------------------------------------
def test_health_is_503_until_every_model_is_warm():
    gates = {"a": threading.Event(), "b": threading.Event()}

    def builder(name):
        def build():
            gates[name].wait(30)
            return fake_engine()
        return build

    models = ModelRegistry([ServedModel(n, AsyncEngine(builder(n))) for n in gates])
    app = create_app(models, server_config())
    models.start()
    try:
        async def health():
            async with client(app) as http:
                return await http.get("/health")
        r = run(health())
        assert r.status_code == 503 and "(a)" in r.json()["error"]["message"]
        gates["a"].set()
        assert wait_until(lambda: models.get("a").async_engine.is_healthy, 10)
        r = run(health())
        assert r.status_code == 503 and "(b)" in r.json()["error"]["message"]  # a is warm, b is not
        gates["b"].set()
        assert wait_until(lambda: run(health()).status_code == 200, 10)
    finally:
        gates["a"].set(), gates["b"].set()
        models.shutdown()


def test_chat_falls_back_only_to_a_model_with_a_chat_template():
    plain = copy.copy(tokenizer())
    plain._tok = copy.deepcopy(plain._tok)
    plain._tok.chat_template = None
    models = registry({"big": fake_engine(), "small": fake_engine(tok=plain)})
    models.get("big").async_engine.ttft = ControlledEstimate()
    models.get("big").async_engine.ttft.forced = 10 * SLO
    app = create_app(models, server_config())
    models.start()
    try:
        chat = run(post(app, "/v1/chat/completions", {"model": "big", "max_tokens": 2,
                                                      "messages": [{"role": "user", "content": "hi"}]}))
        text = run(post(app, "/v1/completions", {"model": "big", "prompt": "hi", "max_tokens": 2}))
    finally:
        models.shutdown()
    assert chat.status_code == 200 and chat.headers[SERVED_BY_HEADER] == "big"
    assert text.status_code == 200 and text.headers[SERVED_BY_HEADER] == "small"


def test_the_measured_estimate_moves_requests_behind_a_long_prefill():
    """No forced estimate: a slow primary (16 prompt tokens per 20 ms step) with a 900-token
    prompt in prefill measures ~800 tokens/s, so a new request's estimate is ~1 s > 0.2 s."""
    slow = fake_engine(max_model_len=1024, max_num_batched_tokens=16, num_blocks=129, step_delay=0.02)
    models = registry({"big": slow, "small": fake_engine()}, slo=0.2)
    app = create_app(models, server_config())
    models.start()
    ttft = models.get("big").async_engine.ttft
    long_prompt = list(range(100, 1000))
    probe = [5, 6, 7]

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as http:
            first = asyncio.create_task(http.post("/v1/completions", json={"model": "big", "prompt": long_prompt,
                                                                         "max_tokens": 1}))
            while ttft.rate is None:  # the first saturated step was measured
                await asyncio.sleep(0.005)
            moved = await http.post("/v1/completions", json={"model": "big", "prompt": probe, "max_tokens": 3})
            kept = asyncio.create_task(http.post("/v1/completions", json={
                "model": "big", "prompt": probe, "max_tokens": 3, "allow_fallback": False}))
            return await first, moved, await kept

    try:
        first, moved, kept = run(go())
    finally:
        models.shutdown()
    assert ttft.pending_tokens == 0 and ttft.rate > 0
    assert first.headers[SERVED_BY_HEADER] == "big"  # no measurement yet when it came
    assert moved.headers[SERVED_BY_HEADER] == "small"
    assert moved.json()["choices"][0]["text"] == tokenizer().decode(expected_ids(probe, 3))
    assert kept.headers[SERVED_BY_HEADER] == "big"


def test_a_full_queue_sends_the_request_to_the_fallback_instead_of_a_429():
    primary = fake_engine(max_num_seqs=1, max_queue_len=1, step_delay=0.01)  # one runs, one waits
    models = registry({"big": primary, "small": fake_engine()}, slo=1000.0)  # the estimate alone never moves
    app = create_app(models, server_config())
    models.start()
    body = {"model": "big", "prompt": [5, 6, 7], "max_tokens": 2}

    async def go():
        async with client(app) as http:
            running = asyncio.create_task(http.post("/v1/completions", json={**body, "max_tokens": 100}))
            while primary.num_running < 1:
                await asyncio.sleep(0.005)
            waiting = asyncio.create_task(http.post("/v1/completions", json=body))
            while primary.num_waiting < 1:
                await asyncio.sleep(0.005)
            moved = await http.post("/v1/completions", json=body)
            refused = await http.post("/v1/completions", json={**body, "allow_fallback": False})
            return await running, await waiting, moved, refused

    try:
        running, waiting, moved, refused = run(go())
    finally:
        models.shutdown()
    assert running.headers[SERVED_BY_HEADER] == waiting.headers[SERVED_BY_HEADER] == "big"
    assert moved.status_code == 200 and moved.headers[SERVED_BY_HEADER] == "small"
    assert moved.json()["choices"][0]["text"] == waiting.json()["choices"][0]["text"]  # same fake model
    assert_error(refused, 429)


class GatedRunner(FakeRunner):
    """`FakeRunner` whose steps wait for `gate` (set: run freely)."""

    def __init__(self):
        super().__init__(V)
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, inputs):
        self.gate.wait(30)
        return super().execute(inputs)


def test_a_burst_within_one_step_sees_itself_in_the_estimate():
    """Six 30-token requests arrive while the primary is inside a step, behind 10 prompt
    tokens, at a rate of 100 tokens/s and an SLO of 1.05 s: the first three fit (0.4, 0.7,
    1.0 s), the other three move. Counted only once the engine thread took them (between
    two steps), all six saw the same queue and stayed."""
    runner = GatedRunner()
    models = registry({"big": fake_engine(runner=runner), "small": fake_engine()}, slo=1.05)
    app = create_app(models, server_config())
    models.start()
    assert models.wait_ready()  # the gated step below reads the built engine
    big = models.get("big").async_engine
    body = {"model": "big", "prompt": list(range(10, 40)), "max_tokens": 2}

    async def go():
        async with client(app) as http:
            runner.gate.clear()
            busy = asyncio.create_task(http.post("/v1/completions", json={
                **body, "prompt": list(range(10, 20)), "allow_fallback": False}))
            while not big.engine.num_running:  # the engine thread is in the step that waits for the gate
                await asyncio.sleep(0.005)
            big.ttft.rate = 100.0  # as if measured
            burst = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(6)]
            deadline = asyncio.get_running_loop().time() + 10
            while big._inbox.qsize() + sum(t.done() for t in burst) < 6:  # every request was decided
                if asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.005)
            runner.gate.set()
            return await busy, await asyncio.gather(*burst)

    try:
        busy, burst = run(go())
    finally:
        runner.gate.set()
        models.shutdown()
    assert busy.status_code == 200 and all(r.status_code == 200 for r in burst)
    assert sorted(r.headers[SERVED_BY_HEADER] for r in burst) == ["big"] * 3 + ["small"] * 3
    assert big.ttft.pending_tokens == 0
    assert big.ttft.slots == 8  # max_num_seqs, set when the engine was built


def test_a_request_moved_to_a_full_fallback_goes_back_to_its_own_queue():
    """The estimate moves the request, the fallback's queue is full, the primary has room:
    it is served by the primary (a 429 would turn away what the primary alone queues)."""
    small = fake_engine(max_num_seqs=1, max_queue_len=1, step_delay=0.01)  # one runs, one waits
    models = registry({"big": fake_engine(), "small": small})
    models.get("big").async_engine.ttft = ControlledEstimate()
    models.get("big").async_engine.ttft.forced = 10 * SLO
    app = create_app(models, server_config())
    models.start()
    body = {"model": "small", "prompt": [5, 6, 7], "max_tokens": 2}

    async def go():
        async with client(app) as http:
            running = asyncio.create_task(http.post("/v1/completions", json={**body, "max_tokens": 100}))
            while small.num_running < 1:
                await asyncio.sleep(0.005)
            waiting = asyncio.create_task(http.post("/v1/completions", json=body))
            while small.num_waiting < 1:
                await asyncio.sleep(0.005)
            back = await http.post("/v1/completions", json={**body, "model": "big"})
            metrics = (await http.get("/metrics")).text
            return await running, await waiting, back, metrics

    try:
        running, waiting, back, metrics = run(go())
    finally:
        models.shutdown()
    assert running.status_code == waiting.status_code == 200
    assert back.status_code == 200 and back.headers[SERVED_BY_HEADER] == "big"
    key = ("jaxinfer_requests_degraded_total", (("fallback", "small"), ("model_name", "big")))
    assert series(metrics)[key] == 0  # counted only when the fallback answers
