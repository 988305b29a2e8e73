"""Load generator (`jaxinfer.bench`) against a stub server with hand-computable timings.

The stub answers ``/v1/completions`` with an SSE stream: the first token after
``TTFT_S`` seconds, then one token every ``GAP_S`` seconds, ``max_tokens`` tokens in all,
then a usage chunk and ``[DONE]``. The prompt's first token id picks a failure instead:
429 (with Retry-After), 400, 500, a mid-stream error event, or a hang (client timeout).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

from pathlib import Path

import numpy as np
import pytest

from jaxinfer.bench import load, report, stats, workloads
from jaxinfer.bench.client import RequestResult
from jaxinfer.bench.workloads import BenchRequest, WorkloadConfig

REPO = Path(__file__).resolve().parents[1]
TTFT_S, GAP_S = 0.30, 0.10
CODE_429, CODE_400, CODE_500, CODE_STREAM_ERR, CODE_HANG = 429, 400, 500, 7, 8
CODE_429_ONCE = 9  # 429 with Retry-After 0.2 s the first time a prompt arrives, then served


class Stub:
    """The stub's counters (read by tests after the run)."""

    def __init__(self):
        self.received = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.seen: dict[tuple, int] = {}


def make_app(stub: Stub):
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def completions(request):
        body = await request.json()
        stub.received += 1
        code, n = body["prompt"][0], body["max_tokens"]
        key = tuple(body["prompt"])
        stub.seen[key] = stub.seen.get(key, 0) + 1
        if code == CODE_429_ONCE and stub.seen[key] == 1:
            return JSONResponse({"error": {"message": "busy"}}, status_code=429, headers={"Retry-After": "0.2"})
        if code == CODE_429:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=429, headers={"Retry-After": "3"})
        if code in (CODE_400, CODE_500):
            return JSONResponse({"error": {"message": "no"}}, status_code=code)

        async def events():
            stub.in_flight += 1
            stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
            try:
                if code == CODE_HANG:
                    await asyncio.sleep(30)
                await asyncio.sleep(TTFT_S)
                for i in range(n):
                    if i:
                        await asyncio.sleep(GAP_S)
                    if code == CODE_STREAM_ERR and i == 2:
                        yield f"data: {json.dumps({'error': {'message': 'boom', 'code': 'x'}})}\n\n"
                        break
                    yield f"data: {json.dumps({'choices': [{'index': 0, 'text': f't{i}'}]})}\n\n"
                usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n}
                yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                stub.in_flight -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])


@pytest.fixture()
def stub_server():
    import uvicorn

    stub = Stub()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(make_app(stub), log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", stub
    server.should_exit = True
    thread.join(5)
    sock.close()


def reqs(codes, n_out=5):
    return [BenchRequest([c, 11, 12], 3, n_out) for c in codes]


def run(url, requests, warmup=(), **kw):
    cfg = load.LoadConfig(url, "stub", progress=False, **kw)
    return asyncio.run(load.run(cfg, requests, warmup))


# ----- timings from the stream ---------------------------------------------------------------
def test_ttft_tpot_itl_e2e_from_stream(stub_server):
    url, _ = stub_server
    (r,), duration = run(url, reqs([100], n_out=5))
    assert r.outcome == "ok" and r.status == 200 and r.output_tokens == 5 and r.prompt_tokens == 3
    tol = 0.08  # sleeps never end early, but may end late on a busy shared machine
    assert TTFT_S <= r.ttft < TTFT_S + tol, r
    assert len(r.itl) == 4 and sum(r.itl) == pytest.approx(r.e2el - r.ttft, abs=tol), r
    assert TTFT_S + 4 * GAP_S <= r.e2el < TTFT_S + 4 * GAP_S + 2 * tol, r
    assert r.tpot == pytest.approx((r.e2el - r.ttft) / 4)  # excludes the first token
    assert abs(r.tpot - GAP_S) < tol / 2, r
    assert duration >= r.e2el


def test_status_counting_and_retry_after(stub_server):
    url, _ = stub_server
    codes = [100, CODE_429, CODE_400, CODE_500, CODE_STREAM_ERR, CODE_HANG, 101]
    results, _ = run(url, reqs(codes), concurrency=len(codes), timeout_s=1.0)
    assert [r.outcome for r in results] == ["ok", "http_429", "http_4xx", "http_5xx", "stream_error", "timeout", "ok"]
    assert results[1].retry_after == 3.0 and results[1].status == 429
    counts = stats.count_outcomes(results)
    assert counts == {"ok": 2, "http_429": 1, "http_4xx": 1, "http_5xx": 1, "timeout": 1, "client_error": 0,
                      "stream_error": 1, "http_200": 4, "total": 7}


def test_retries_honour_retry_after(stub_server):
    url, stub = stub_server
    results, _ = run(url, reqs([CODE_429_ONCE, CODE_429, 100]), concurrency=3, max_retries=2, max_retry_after_s=0.5)
    once, always, plain = results
    assert once.outcome == "ok" and once.attempts == 2
    assert 0.2 <= once.retry_wait < 0.2 + 0.5  # waited Retry-After before resending
    assert always.outcome == "http_429" and always.attempts == 3  # Retry-After 3 s capped at 0.5 s
    assert 1.0 <= always.retry_wait < 2.0
    assert plain.attempts == 1 and plain.retry_wait == 0.0
    summary = stats.aggregate(results, 1.0)
    assert summary["retries"] == 1 + 2
    assert summary["ttft_with_retries_ms"]["count"] == 2
    assert stub.received == 2 + 3 + 1


def test_without_retries_a_429_is_final(stub_server):
    url, stub = stub_server
    (r,), _ = run(url, reqs([CODE_429_ONCE]))
    assert r.outcome == "http_429" and r.attempts == 1 and stub.received == 1


def test_connection_refused_is_a_client_error():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    (r,), _ = run(f"http://127.0.0.1:{port}", reqs([100]), timeout_s=5.0)
    assert r.outcome == "client_error" and r.status is None and r.ttft is None


def test_closed_loop_concurrency_and_warmup_excluded(stub_server):
    url, stub = stub_server
    results, duration = run(url, reqs([100] * 9), warmup=reqs([100] * 2), concurrency=3)
    assert len(results) == 9 and stub.received == 11 and all(r.outcome == "ok" for r in results)
    assert stub.max_in_flight == 3
    one = TTFT_S + 4 * GAP_S
    assert 3 * one <= duration < 3 * one + 1.5  # three rounds of three (nine in a row would take 9 * one)


def test_open_loop_all_at_once(stub_server):
    url, stub = stub_server
    results, duration = run(url, reqs([100] * 6), concurrency=None, request_rate=float("inf"))
    assert stub.max_in_flight == 6 and all(r.outcome == "ok" for r in results)
    assert duration < 2 * (TTFT_S + 4 * GAP_S) + 0.6  # in parallel (one after another: 6x)


def test_arrival_gaps_mean_and_burstiness():
    g = load.arrival_gaps(4.0, 1.0, 40000, seed=1)
    assert g.mean() == pytest.approx(0.25, rel=0.02)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV 1
    bursty = load.arrival_gaps(4.0, 0.25, 40000, seed=1)
    assert bursty.mean() == pytest.approx(0.25, rel=0.04)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.05)  # gamma: CV = 1 / sqrt(shape)
    assert not load.arrival_gaps(float("inf"), 1.0, 5).any()


# ----- aggregation ---------------------------------------------------------------------------
def test_percentiles_by_hand():
    s = stats.summarize_ms([k / 1000 for k in range(1, 101)])  # 1..100 ms
    assert s["count"] == 100 and s["mean"] == pytest.approx(50.5) and s["median"] == pytest.approx(50.5)
    # linear interpolation: rank q/100 * (n - 1)
    assert s["p90"] == pytest.approx(90.1) and s["p95"] == pytest.approx(95.05) and s["p99"] == pytest.approx(99.01)
    assert stats.summarize_ms([])["p99"] is None


def ok(ttft, e2el, n_out, prompt=10):
    return RequestResult("ok", 200, prompt, n_out, 0.0, prompt_tokens=prompt, output_tokens=n_out, ttft=ttft,
                         e2el=e2el, itl=[(e2el - ttft) / (n_out - 1)] * (n_out - 1))


def test_aggregate_throughput_and_goodput_by_hand():
    rs = [ok(0.1, 1.1, 11), ok(0.5, 1.5, 11), ok(0.1, 3.1, 11),  # TPOT 100, 100, 300 ms
          RequestResult("http_429", 429, 10, 11, 0.0)]
    s = stats.aggregate(rs, duration_s=4.0, slo_ttft_ms=200, slo_tpot_ms=150)
    assert s["completed"] == 3 and s["output_tokens"] == 33 and s["input_tokens"] == 30
    assert s["output_throughput_tok_s"] == pytest.approx(33 / 4)
    assert s["total_token_throughput_tok_s"] == pytest.approx(63 / 4)
    assert s["request_throughput_req_s"] == pytest.approx(3 / 4)
    assert s["slo"]["requests_meeting"] == 1 and s["goodput_req_s"] == pytest.approx(1 / 4)  # only the first
    assert s["tpot_ms"]["median"] == pytest.approx(100) and s["ttft_ms"]["mean"] == pytest.approx(700 / 3)
    assert s["counts"]["http_429"] == 1 and s["itl_ms"]["count"] == 30


def parse_console(text: str) -> dict[str, str]:
    """``"Name:   value"`` lines of `report.console_summary` -> {name: value}."""
    return dict(ln.rsplit(":", 1) for ln in text.splitlines() if ":" in ln and not ln.startswith(("=", "-")))


def test_console_summary_has_vllms_lines_by_hand():
    rs = [ok(0.1, 1.1, 11, prompt=7), ok(0.5, 1.5, 11, prompt=9), ok(0.3, 2.3, 6, prompt=4),  # TPOT 100, 100, 400 ms
          RequestResult("http_429", 429, 10, 11, 0.0), RequestResult("timeout", None, 10, 11, 0.0)]
    text = report.console_summary(stats.aggregate(rs, duration_s=4.0), "c8")
    lines = text.strip().splitlines()
    assert lines[0].startswith("=") and "Serving Benchmark Result (c8)" in lines[0] and lines[-1] == "=" * 50
    assert {len(ln) for ln in lines} == {50}
    got = {k.strip(): v.strip() for k, v in parse_console(text).items()}
    assert (got["Successful requests"], got["Failed requests"], got["http_429"], got["timeout"]) == ("3", "2", "1", "1")
    assert "client_error" not in got and "Request goodput (req/s)" not in got  # zero counts and unset SLOs left out
    assert got["Benchmark duration (s)"] == "4.00"
    assert (got["Total input tokens"], got["Total generated tokens"]) == ("20", "28")
    assert got["Request throughput (req/s)"] == "0.75" and got["Output token throughput (tok/s)"] == "7.00"
    assert got["Total token throughput (tok/s)"] == "12.00"  # (20 + 28) / 4
    assert (got["Mean TTFT (ms)"], got["Median TTFT (ms)"]) == ("300.00", "300.00")
    assert got["P90 TTFT (ms)"] == "460.00" and got["P99 TTFT (ms)"] == "496.00"  # 300 + 0.8 * 200, 300 + 0.98 * 200
    assert (got["Mean TPOT (ms)"], got["Median TPOT (ms)"], got["P90 TPOT (ms)"]) == ("200.00", "100.00", "340.00")
    assert got["Median ITL (ms)"] == "100.00" and got["P99 ITL (ms)"] == "400.00"  # 20 gaps of 100, 5 of 400
    assert (got["Mean E2EL (ms)"], got["P99 E2EL (ms)"]) == ("1633.33", "2284.00")
    for name in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert all(f"{stat} {name} (ms)" in got for stat in ("Mean", "Median", "P90", "P99"))
    slo = report.console_summary(stats.aggregate(rs, 4.0, slo_tpot_ms=150))
    assert parse_console(slo)["Request goodput (req/s)"].strip() == "0.50"  # the two 100 ms TPOT requests
    assert "-" in parse_console(report.console_summary(stats.aggregate(rs[3:], 1.0)))["Mean TTFT (ms)"]


def test_report_files(tmp_path):
    rs = [ok(0.1, 1.1, 11), ok(0.2, 1.0, 5)]
    s = stats.aggregate(rs, 2.0)
    s["kv_fragmentation"] = 0.125
    md = report.markdown_table([("a", s), ("b", s)])
    lines = md.strip().splitlines()
    assert len(lines) == 4 and lines[2].startswith("| a | 2/2 | 8.0 |") and "0.125" in lines[2]
    assert len({ln.count("|") for ln in lines}) == 1  # every row has every column
    png = report.plot_cdfs(tmp_path / "x_cdf.png", [("a", rs)])
    sweep = report.plot_sweep(tmp_path / "sweep.png", {"a": [(1, s), (4, s)]})
    assert png.read_bytes()[:4] == b"\x89PNG" and sweep.stat().st_size > 1000
    out = report.write_json(tmp_path / "x.json", report.result_dict("a", {}, s, rs))
    back = json.loads(out.read_text())
    assert back["requests"][0]["tpot"] == pytest.approx(0.1) and back["summary"]["completed"] == 2


# ----- workloads -----------------------------------------------------------------------------
def lengths(name, n=20000, **kw):
    ins, outs = workloads.sample_lengths(WorkloadConfig(name=name, **kw), n, np.random.default_rng(0))
    return ins, outs


def test_fixed_and_uniform_and_normal_lengths():
    ins, outs = lengths("fixed", n=10, input_len=512, output_len=256)
    assert set(ins) == {512} and set(outs) == {256}
    ins, outs = lengths("uniform", input_len=100, output_len=40, range_ratio=0.5)
    assert ins.min() == 50 and ins.max() == 150 and ins.mean() == pytest.approx(100, rel=0.01)
    assert outs.min() == 20 and outs.max() == 60
    ins, _ = lengths("normal", input_len=400, std_ratio=0.25)
    assert ins.mean() == pytest.approx(400, rel=0.01) and ins.std() == pytest.approx(100, rel=0.03)


def test_sharegpt_lengths_match_published_means():
    ins, outs = lengths("sharegpt-synthetic", n=100000, max_input_len=10**9, max_output_len=10**9)
    assert ins.mean() == pytest.approx(workloads.SHAREGPT_MEAN_INPUT, rel=0.03)
    assert outs.mean() == pytest.approx(workloads.SHAREGPT_MEAN_OUTPUT, rel=0.03)
    # lognormal: median = mean * exp(-sigma^2 / 2)
    assert np.median(ins) == pytest.approx(161.31 * np.exp(-0.5), rel=0.03)
    clipped, _ = lengths("sharegpt", max_input_len=300)  # the old name still works
    assert clipped.max() == 300 and clipped.min() >= 4


def test_sharegpt_workload_is_named_synthetic():
    old = WorkloadConfig(name="sharegpt", num_requests=3)
    assert old.name == "sharegpt-synthetic" == workloads.SHAREGPT
    assert old == WorkloadConfig(name=old.name, num_requests=3)
    desc = workloads.describe(old)
    assert desc["name"] == "sharegpt-synthetic" and desc["sharegpt"]["synthetic"] is True
    assert [r.prompt for r in workloads.build_requests(old)] == [
        r.prompt for r in workloads.build_requests(WorkloadConfig(name="sharegpt-synthetic", num_requests=3))]


def test_shared_prefix_prompts():
    cfg = WorkloadConfig(name="shared-prefix", num_requests=6, input_len=10, prefix_len=32, num_prefixes=2)
    rs = workloads.build_requests(cfg)
    assert all(len(r.prompt) == r.prompt_len == 42 for r in rs)
    assert rs[0].prompt[:32] == rs[2].prompt[:32] == rs[4].prompt[:32] != rs[1].prompt[:32]
    assert rs[0].prompt[32:] != rs[2].prompt[32:]
    again = workloads.build_requests(cfg)
    assert [r.prompt for r in again] == [r.prompt for r in rs]  # seeded
    lo, hi = cfg.token_id_range
    assert all(lo <= t < hi for r in rs for t in r.prompt)


def test_unknown_workload_rejected():
    with pytest.raises(ValueError, match="unknown workload"):
        WorkloadConfig(name="zipf")


def test_client_imports_no_jax():
    from helpers import assert_imports_no_jax

    assert_imports_no_jax("import jaxinfer.bench.serve")  # no JAX next to the server it measures


# ----- command line --------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
def test_help_exits_0(argv):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "jaxinfer.bench", *argv], capture_output=True, text=True, timeout=120,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "serve" in r.stdout and r.stdout.startswith("usage: python -m jaxinfer.bench")
    if argv[0] == "serve":
        assert "--endpoint {completions,chat}" in r.stdout and "sharegpt-synthetic" in r.stdout
        assert "SYNTHETIC" in r.stdout and "dataset is not used" in " ".join(r.stdout.split())


def test_cli_prints_the_summary_and_keeps_the_json(stub_server, tmp_path, capsys):
    from jaxinfer.bench import serve

    url, stub = stub_server
    runs = serve.main(["--base-url", url, "--model", "stub", "--num-requests", "4", "--concurrency", "2",
                       "--input-len", "3", "--output-len", "3", "--warmup-requests", "0", "--no-progress",
                       "--out", str(tmp_path), "--label", "cli", "--workload", "fixed"])
    out = capsys.readouterr().out
    got = {k.strip(): v.strip() for k, v in parse_console(out).items()}
    assert got["Successful requests"] == "4" and got["Total generated tokens"] == "12" and stub.received == 4
    saved = json.loads((tmp_path / "cli.json").read_text())
    assert saved["summary"]["completed"] == 4 and saved["summary"]["failed"] == 0
    assert float(got["Mean E2EL (ms)"]) == pytest.approx(saved["summary"]["e2el_ms"]["mean"], abs=0.01)
    assert saved["metadata"]["load"]["endpoint"] == "completions" == runs[0]["requests"][0]["endpoint"]
    with pytest.raises(SystemExit):
        serve.main(["--endpoint", "chat", "--prompt-format", "token-ids"])  # chat messages are text


def test_chat_endpoint_against_the_api(tmp_path):
    """``--endpoint chat`` against the real app (fake runner, real tokenizer): the body is
    accepted, outputs are exact, and input tokens are the raw prompts' (the server's count
    adds the chat template's tokens)."""
    from api_helpers import LiveServer, fake_engine, running_app, tokenizer

    from jaxinfer.bench import serve
    from jaxinfer.tokenizer.chat import render_conversation

    with running_app(fake_engine()) as (app, _), LiveServer(app) as srv:
        runs = serve.main(["--base-url", srv.url, "--model", "test-model", "--endpoint", "chat", "--num-requests", "3",
                           "--concurrency", "3", "--input-len", "20", "--output-len", "5", "--warmup-requests", "1",
                           "--tokenizer", str(REPO / "weights" / "smollm2-135m-instruct" / "tokenizer.json"),
                           "--no-progress", "--out", str(tmp_path), "--label", "chat"])
    rs, summary = runs[0]["requests"], runs[0]["summary"]
    assert [r["outcome"] for r in rs] == ["ok"] * 3 and all(r["output_tokens"] == 5 and r["ttft"] for r in rs)
    t = tokenizer()
    texts = [r.prompt for r in workloads.build_requests(WorkloadConfig(num_requests=3, input_len=20, output_len=5),
                                                        decode=t.decode)]
    raw = [len(t.encode(x, add_special_tokens=False)) for x in texts]
    templated = [len(render_conversation([{"role": "user", "content": x}], t)[1]) for x in texts]
    assert [r["prompt_len"] for r in rs] == raw and summary["input_tokens"] == sum(raw)
    assert [r["prompt_tokens"] for r in rs] == templated and summary["server_prompt_tokens"] == sum(templated)
    assert all(a > b for a, b in zip(templated, raw))
    assert summary["total_token_throughput_tok_s"] == pytest.approx((sum(raw) + 15) / summary["duration_s"])
