"""``GET /metrics`` as a dashboard reads it (issue 11): request-phase and length histograms,
finished requests by reason, HTTP errors by status, ``model_name`` on every series, no
``*_created`` series, current KV fragmentation, data-parallel snapshots, and the Grafana
dashboard in ``deploy/`` using only names the server exposes.

Fake-runner engines (next token = last + 1, a logit_bias >= 50 forces that token) behind
the real app, in process. Expected values come from the requests sent (prompt and output
lengths chosen here, statuses provoked here) and from the block size, not from the code
under test; the exposition is parsed with prometheus_client's own parser.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api_helpers import EOS, REPO, V, client, fake_engine, running_app
from fakes import FakeRunner
from jaxinfer.bench.metadata import parse_metrics as bench_parse_metrics
from jaxinfer.bench.serve import step_mean_fragmentation
from jaxinfer.entrypoints.openai.metrics import _COUNTERS, Metrics
from jaxinfer.entrypoints.openai.model_registry import ModelRegistry
from jaxinfer.engine.dp_router import DataParallelRouter
from jaxinfer.engine.protocol import RequestSpec
from jaxinfer.sampling_params import SamplingParams

NAME = "metrics-model"  # a served name unlike the other tests' default
STEP = 0.01  # seconds the fake runner sleeps per step
HISTOGRAMS = ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds",
              "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
              "request_prompt_tokens", "request_generation_tokens")
DASHBOARD = REPO / "deploy" / "grafana" / "jaxinfer-dashboard.json"


def samples(text: str) -> list:
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(text: str, name: str, **labels) -> float:
    """The sample ``name`` whose labels include ``labels`` (exactly one must match)."""
    hits = [s.value for s in samples(text) if s.name == name and labels.items() <= s.labels.items()]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def completion(http, prompt: list[int], max_tokens: int, **extra):
    return http.post("/v1/completions", json={"model": NAME, "prompt": prompt, "max_tokens": max_tokens, **extra})


@pytest.fixture(scope="module")
def api():
    engine = fake_engine(step_delay=STEP)
    with running_app(engine, served_model_name=NAME) as (app, ae):
        yield SimpleNamespace(http=TestClient(app, raise_server_exceptions=False), engine=engine, app=app)


def test_histograms_observe_each_finished_request(api):
    """Three requests with chosen prompt / output lengths: every histogram counts 3, the
    length buckets and sums match the lengths, and the phases add up to the end-to-end time."""
    before = api.http.get("/metrics").text
    sent = [([300 + i for i in range(5)], 5, {}),  # length: 5 tokens
            ([400 + i for i in range(9)], 4, {"logit_bias": {str(EOS): 100}}),  # stop: EOS first, 1 token
            ([500, 501, 502], 3, {})]  # length: 3 tokens
    for prompt, max_tokens, extra in sent:
        r = completion(api.http, prompt, max_tokens, **extra)
        assert r.status_code == 200, r.text
    after = api.http.get("/metrics").text

    def delta(name, **labels):
        return value(after, f"jaxinfer_{name}", **labels) - value(before, f"jaxinfer_{name}", **labels)

    prompt_lens, output_lens = [5, 9, 3], [5, 1, 3]
    for h in HISTOGRAMS:
        expected = sum(n > 1 for n in output_lens) if h == "time_per_output_token_seconds" else 3
        assert delta(f"{h}_count") == expected, h
    assert delta("request_prompt_tokens_sum") == sum(prompt_lens)
    assert delta("request_generation_tokens_sum") == sum(output_lens)
    for le in (1, 2, 5, 10):  # cumulative buckets, le as prometheus_client writes it
        assert delta("request_prompt_tokens_bucket", le=f"{float(le)}") == sum(n <= le for n in prompt_lens)
        assert delta("request_generation_tokens_bucket", le=f"{float(le)}") == sum(n <= le for n in output_lens)
    queue, prefill, decode, e2e, ttft = (delta(f"{h}_sum") for h in (
        "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
        "e2e_request_latency_seconds", "time_to_first_token_seconds"))
    assert queue >= 0
    assert prefill >= 3 * STEP * 0.9  # each first token takes one fake step
    assert decode >= sum(n - 1 for n in output_lens) * STEP * 0.9  # one step per later token
    assert math.isclose(queue + prefill + decode, e2e, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(queue + prefill, ttft, rel_tol=1e-9, abs_tol=1e-9)


class _HeldRunner(FakeRunner):
    """A fake runner whose steps wait for ``release`` while ``hold`` is set (``in_step`` says one does)."""

    def __init__(self):
        super().__init__(V)
        self.hold, self.release, self.in_step = threading.Event(), threading.Event(), threading.Event()

    def execute(self, inputs):
        if self.hold.is_set():
            self.in_step.set()
            self.release.wait(30)
        return super().execute(inputs)


HELD = 0.5  # seconds the second request waits, received, while a step is in progress


def test_queue_time_counts_from_the_servers_receipt():
    """A request received while a step runs waits for that step to end before the engine
    thread takes it. That wait is in its queue time and TTFT: the HTTP layer stamps the
    arrival (as vLLM's API server does), not the engine thread when it takes the request."""
    runner = _HeldRunner()
    with running_app(fake_engine(runner=runner), served_model_name=NAME) as (app, ae):
        async def scenario():
            async with client(app) as http:
                body = {"model": NAME, "max_tokens": 1}
                before = (await http.get("/metrics")).text
                runner.hold.set()
                first = asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": [300, 301]}))
                await asyncio.to_thread(runner.in_step.wait, 30)  # the first request's step is in progress
                second = asyncio.create_task(http.post("/v1/completions", json={**body, "prompt": [400, 401]}))
                while ae._inbox.qsize() == 0:  # received and handed over; the engine thread is in the step
                    await asyncio.sleep(0.01)
                await asyncio.sleep(HELD)
                runner.hold.clear()
                runner.release.set()
                assert [(await t).status_code for t in (first, second)] == [200, 200]
                return before, (await http.get("/metrics")).text
        before, after = asyncio.run(scenario())

    def delta(name):
        return value(after, f"jaxinfer_{name}") - value(before, f"jaxinfer_{name}")

    assert delta("request_queue_time_seconds_count") == 2
    assert delta("request_queue_time_seconds_sum") >= HELD  # the second request's wait for the step


def test_success_total_by_finished_reason(api):
    """One stop, one length and one timeout request: each reason counts exactly its own."""
    before = api.http.get("/metrics").text
    assert completion(api.http, [600, 601], 3).json()["choices"][0]["finish_reason"] == "length"
    r = completion(api.http, [700, 701], 3, logit_bias={str(EOS): 100})
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    r = completion(api.http, [800, 801], 200, request_timeout=5 * STEP)
    assert r.status_code == 504, r.text
    after = api.http.get("/metrics").text
    for reason, n in {"stop": 1, "length": 1, "timeout": 1, "abort": 0, "rejected": 0, "error": 0}.items():
        got = (value(after, "jaxinfer_request_success_total", finished_reason=reason)
               - value(before, "jaxinfer_request_success_total", finished_reason=reason))
        assert got == n, reason
    # the histograms hold only the requests that ended with stop / length
    assert (value(after, "jaxinfer_e2e_request_latency_seconds_count")
            - value(before, "jaxinfer_e2e_request_latency_seconds_count")) == 2


def test_every_series_has_model_name_and_no_created(api):
    assert completion(api.http, [900], 2).status_code == 200
    text = api.http.get("/metrics").text
    assert "_created" not in text
    all_samples = samples(text)
    assert len(all_samples) > 50
    unlabelled = [s.name for s in all_samples if s.labels.get("model_name") != NAME]
    assert not unlabelled, unlabelled


def test_apps_in_one_process_keep_their_own_metrics(api):
    """A second app counts nothing of the first one's requests (one registry per app)."""
    assert completion(api.http, [950], 2).status_code == 200
    with running_app(fake_engine(), served_model_name="other") as (app, _):
        text = TestClient(app).get("/metrics").text
    assert value(text, "jaxinfer_request_success_total", finished_reason="length", model_name="other") == 0
    assert value(text, "jaxinfer_e2e_request_latency_seconds_count") == 0
    assert value(api.http.get("/metrics").text, "jaxinfer_request_success_total", finished_reason="length") >= 1


def test_error_responses_counted_once_by_status():
    """Provoke 401, 400, 404 (model and route), 413 (body limit) and 429 (queue full) once
    each: each status counts exactly what was sent, and 429 also counts as queue_full."""
    engine = fake_engine(step_delay=STEP, max_num_seqs=1, max_queue_len=1)
    auth = {"Authorization": "Bearer k"}
    with running_app(engine, served_model_name=NAME, api_key="k", max_request_bytes=2000) as (app, _):
        async def run() -> tuple[str, str, list[int]]:
            async with client(app) as c:
                before = (await c.get("/metrics")).text
                statuses = [(await c.post("/v1/completions", json={"model": NAME, "prompt": [5]})).status_code,
                            (await c.post("/v1/completions", headers=auth,
                                          json={"model": NAME, "prompt": [5], "temperature": -1})).status_code,
                            (await c.post("/v1/completions", headers=auth,
                                          json={"model": "nope", "prompt": [5]})).status_code,
                            (await c.get("/v1/nowhere", headers=auth)).status_code,
                            (await c.post("/v1/completions", headers=auth,
                                          json={"model": NAME, "prompt": [5] * 2000})).status_code]
                body = {"model": NAME, "prompt": [7, 8], "max_tokens": 30, "ignore_eos": True}
                running = asyncio.create_task(c.post("/v1/completions", headers=auth, json=body))
                await until(c, "jaxinfer_num_requests_running", 1)
                waiting = asyncio.create_task(c.post("/v1/completions", headers=auth, json=body))
                await until(c, "jaxinfer_num_requests_waiting", 1)
                statuses.append((await c.post("/v1/completions", headers=auth, json=body)).status_code)
                statuses += [(await running).status_code, (await waiting).status_code]
                return before, (await c.get("/metrics")).text, statuses

        before, after, statuses = asyncio.run(run())
    assert statuses == [401, 400, 404, 404, 413, 429, 200, 200]
    errors = {s.labels["status"]: s.value for s in samples(after) if s.name == "jaxinfer_http_error_responses_total"}
    errors0 = {s.labels["status"]: s.value for s in samples(before) if s.name == "jaxinfer_http_error_responses_total"}
    got = {k: v - errors0.get(k, 0) for k, v in errors.items() if v - errors0.get(k, 0)}
    assert got == {"401": 1, "400": 1, "404": 2, "413": 1, "429": 1}
    assert (value(after, "jaxinfer_requests_rejected_total", reason="queue_full")
            - value(before, "jaxinfer_requests_rejected_total", reason="queue_full")) == 1


async def until(c, name: str, target: float, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while value((await c.get("/metrics")).text, name) != target:
        assert loop.time() < deadline, f"{name} never reached {target}"
        await asyncio.sleep(0.005)


# ----------------------------------------------------------------------------- KV fragmentation


def test_kv_fragmentation_is_current_not_a_mean():
    """After one prefill step a 5-token prompt fills 5 of one block's 16 slots; once the
    request ends the gauge is 0 again, while the per-step mean stays above 0."""
    engine = fake_engine()
    bs = engine.block_manager.block_size
    engine.add_request("a", [10, 11, 12, 13, 14], SamplingParams(max_tokens=3, temperature=0))
    engine.step()
    snap = engine.snapshot()
    assert snap.kv_slots_reserved == bs and snap.kv_slots_filled == 5
    assert snap.kv_fragmentation_ratio == pytest.approx(1 - 5 / bs)
    while engine.has_unfinished_requests():
        engine.step()
    snap = engine.snapshot()
    assert snap.kv_fragmentation_ratio == 0.0 and snap.kv_slots_reserved == 0
    assert snap.fragmentation_steps > 0 and snap.fragmentation_step_sum > 0
    assert snap.finished["length"] == 1 and snap.num_running == 0


def test_kv_fragmentation_gauge_back_to_zero_when_idle(api):
    assert completion(api.http, list(range(1000, 1020)), 4).status_code == 200
    text = api.http.get("/metrics").text
    assert value(text, "jaxinfer_kv_fragmentation_ratio") == 0.0
    assert value(text, "jaxinfer_num_requests_running") == 0
    assert value(text, "jaxinfer_kv_fragmentation_step_ratio_sum") > 0


def test_data_parallel_snapshot_pools_replicas():
    """Two replicas, one request each: counts add up (the prefix-cache counters too) and the
    fragmentation is pooled over both replicas' slots."""
    engines = [fake_engine(), fake_engine()]
    router = DataParallelRouter(engines)
    try:
        bs = engines[0].block_manager.block_size
        router.add_request("a", list(range(100, 105)), SamplingParams(max_tokens=4, temperature=0))  # 5 tokens
        router.add_request("b", list(range(200, 220)), SamplingParams(max_tokens=4, temperature=0))  # 20 tokens
        assert [e.num_waiting for e in engines] == [1, 1]  # least-loaded: one each
        router.step()
        snap = router.snapshot()
        assert snap.num_running == 2 and snap.prompt_tokens == 25 and snap.prefix_cache_queries == 25
        assert snap.kv_slots_reserved == 3 * bs and snap.kv_slots_filled == 25  # 1 + 2 blocks
        assert snap.kv_fragmentation_ratio == pytest.approx(1 - 25 / (3 * bs))
        assert snap.kv_blocks_total == sum(e.num_total_blocks for e in engines)
        while router.has_unfinished_requests():
            router.step()
        snap = router.snapshot()
        assert snap.finished["length"] == 2 and snap.generation_tokens == 8 and snap.kv_fragmentation_ratio == 0
    finally:
        router.shutdown()


def test_data_parallel_metrics_equal_the_sum_over_replicas():
    """GET /metrics's engine series under DP 2 are the sums of the replicas' own snapshots,
    prefix-cache hits included (both replicas hit their cache)."""
    engines = [fake_engine(), fake_engine()]
    router = DataParallelRouter(engines)
    try:
        prompts = [list(range(100, 140)), list(range(200, 240))]  # 2 full blocks each
        for round_ in range(2):  # the second round finds the first's blocks on the same replicas
            router.add_requests([RequestSpec(f"r{round_}-{i}", p, SamplingParams(max_tokens=3))
                                 for i, p in enumerate(prompts)])
            while router.has_unfinished_requests():
                router.step()
        models = ModelRegistry.single(NAME, SimpleNamespace(engine=router, is_healthy=True))
        text = Metrics(models).render()[0].decode()
        snaps = [e.snapshot() for e in engines]
        assert all(s.prefix_cache_hits > 0 for s in snaps)
        for name, (field, _) in _COUNTERS.items():
            assert value(text, f"jaxinfer_{name}_total") == sum(getattr(s, field) for s in snaps), name
        assert value(text, "jaxinfer_kv_blocks_free") == sum(s.kv_blocks_free for s in snaps)
        assert value(text, "jaxinfer_request_success_total", finished_reason="length") == 4
    finally:
        router.shutdown()


def test_benchmark_reads_labelled_series_and_step_mean():
    """The benchmark's parser keeps series labelled only with model_name; its fragmentation
    is the mean of the per-step samples between two readings."""
    text = ('# TYPE jaxinfer_kv_fragmentation_step_ratio summary\n'
            'jaxinfer_kv_fragmentation_step_ratio_count{model_name="m"} 10.0\n'
            'jaxinfer_kv_fragmentation_step_ratio_sum{model_name="m"} 4.0\n'
            '# TYPE jaxinfer_request_success_total counter\n'
            'jaxinfer_request_success_total{model_name="m",finished_reason="stop"} 3.0\n')
    after = bench_parse_metrics(text)
    assert after == {"kv_fragmentation_step_ratio_count": 10.0, "kv_fragmentation_step_ratio_sum": 4.0}
    before = {"kv_fragmentation_step_ratio_count": 6.0, "kv_fragmentation_step_ratio_sum": 3.0}
    assert step_mean_fragmentation(before, after) == pytest.approx(1.0 / 4.0)
    assert step_mean_fragmentation(after, after) is None and step_mean_fragmentation(None, after) is None


# ----------------------------------------------------------------------------- Grafana dashboard

_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                    "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: strings, label matchers, range selectors and
    grouping clauses removed; identifiers followed by ``(`` are functions or aggregations."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", expr):
        if expr[m.end():].lstrip().startswith("(") or m.group(0).lower() in _PROMQL_KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def test_promql_metric_names():
    expr = ('histogram_quantile(0.95, sum by (le) (rate(jaxinfer_x_bucket{model_name=~"$model_name"}'
            '[$__rate_interval]))) / on (model_name) sum(rate(jaxinfer_y_count{a="b(c)"}[5m])) * 1e3')
    assert promql_metric_names(expr) == {"jaxinfer_x_bucket", "jaxinfer_y_count"}


def dashboard_panels(d: dict) -> list[dict]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # collapsed rows keep theirs inside
    return out


def test_grafana_dashboard_uses_only_exposed_series(api):
    """Every metric name in every panel query is a series this server exposes (after some
    traffic), every selector filters on the model_name variable, and the panels cover
    the request, latency, length, throughput and KV metrics."""
    d = json.loads(DASHBOARD.read_text())
    assert d["schemaVersion"] >= 36 and d["title"] and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "model_name" in variables["model_name"]["definition"]
    assert completion(api.http, [1200, 1201], 3).status_code == 200
    assert completion(api.http, [1300], 3, logit_bias={str(EOS): 100}).status_code == 200
    assert api.http.post("/v1/completions", json={"model": "nope", "prompt": [1]}).status_code == 404
    exposed = {s.name for s in samples(api.http.get("/metrics").text)}
    used = set()
    graph_panels = [p for p in dashboard_panels(d) if p["type"] != "row"]
    assert len({p["id"] for p in dashboard_panels(d)}) == len(dashboard_panels(d))
    for panel in graph_panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for t in panel["targets"]:
            names = promql_metric_names(t["expr"])
            assert names, (panel["title"], t["expr"])
            assert names <= exposed, (panel["title"], names - exposed)
            selectors = re.findall(r"jaxinfer_\w+(\{[^}]*\})?", t["expr"])
            assert all('model_name=~"$model_name"' in s for s in selectors), t["expr"]
            used |= names
    base = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in used}
    wanted = {f"jaxinfer_{h}" for h in HISTOGRAMS} | {
        "jaxinfer_request_success", "jaxinfer_http_error_responses", "jaxinfer_num_requests_running",
        "jaxinfer_num_requests_waiting", "jaxinfer_kv_cache_usage_ratio", "jaxinfer_kv_fragmentation_ratio",
        "jaxinfer_generation_tokens", "jaxinfer_prompt_tokens"}
    assert wanted <= base, wanted - base
    for h in HISTOGRAMS:  # p50 / p95 / p99 of every histogram
        exprs = [t["expr"] for p in graph_panels for t in p["targets"] if f"jaxinfer_{h}_bucket" in t["expr"]]
        assert {q for q in ("0.5", "0.95", "0.99") if any(f"histogram_quantile({q}," in e for e in exprs)} == \
            {"0.5", "0.95", "0.99"}, h
