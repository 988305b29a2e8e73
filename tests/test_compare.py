"""benchmarks/compare.py (the serving comparison) and benchmarks/llamacpp_peer.py (llama.cpp as
its peer system): ratios and acceptance lines computed by hand, which systems run which
scenario, the jaxinfer command lines read back through server.py's own flag parser (one KV
budget for both batching modes), llama-server's command line, the build's failure report
and cache, the server start / health / stop cycle on a stand-in server and, when llama.cpp
has been built on this machine, the real llama-server answering the load generator.
"""
from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
import types
from pathlib import Path

import pytest

from jaxinfer.bench import load, workloads
from jaxinfer.bench.workloads import WorkloadConfig

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """Import ``benchmarks/<name>.py`` (not a package) as a module."""
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def entry(tok_s, ttft_p99, tpot_p50, ok=10, total=10, frag=None):
    """A compare.json system entry with the fields ratios / acceptance read."""
    lat = {"mean": None, "p50": None, "median": None, "p95": None, "p99": None}
    return {"concurrency": 1, "output_throughput_tok_s": tok_s, "ttft_ms": {**lat, "p99": ttft_p99},
            "tpot_ms": {**lat, "p50": tpot_p50, "median": tpot_p50}, "itl_ms": lat, "e2el_ms": lat,
            "kv_fragmentation": frag, "counts": {"ok": ok, "total": total}}


def test_compare_ratios_and_acceptance_by_hand():
    compare = load_benchmark("compare")
    scen = {"fixed": {"jaxinfer": entry(150.0, 1000.0, 50.0), "llamacpp": entry(100.0, 2500.0, 40.0),
                      "jaxinfer-static": entry(120.0, 4000.0, 30.0)},
            "single": {"jaxinfer": entry(80.0, 200.0, 12.0), "llamacpp": entry(83.0, 250.0, 10.0)},
            "c128": {"jaxinfer": entry(90.0, 5.0, 5.0, ok=127, total=128, frag=0.015),
                     "jaxinfer-static": entry(60.0, 9.0, 5.0, ok=96, total=128)}}
    r = compare.ratios(scen)
    assert r["fixed"]["jaxinfer/llamacpp"] == pytest.approx(
        {"output_throughput": 1.5, "ttft_p99": 0.4, "tpot_p50": 1.25})
    assert r["fixed"]["jaxinfer/jaxinfer-static"]["output_throughput"] == pytest.approx(1.25)
    assert set(r) == {"fixed", "single", "c128"} and set(r["single"]) == {"jaxinfer/llamacpp"}
    by_line = {(a["scenario"], a["quantity"]): a for a in compare.acceptance(scen, r)}
    assert by_line[("fixed", "jaxinfer/llamacpp output_throughput")]["pass"] is True  # 1.5 >= 1.5
    assert by_line[("fixed", "jaxinfer/llamacpp ttft_p99")]["pass"] is True  # 0.4 <= 0.5
    assert by_line[("fixed", "jaxinfer/jaxinfer-static output_throughput")]["pass"] is True  # 1.25 >= 1.1
    assert by_line[("fixed", "jaxinfer/jaxinfer-static ttft_p99")]["pass"] is True  # 0.25 <= 1/3
    assert by_line[("single", "jaxinfer/llamacpp tpot_p50")]["pass"] is False  # 12 ms > 10 ms
    assert by_line[("fixed8", "jaxinfer/llamacpp output_throughput")]["pass"] is None  # not run
    assert by_line[("sharegpt", "jaxinfer/jaxinfer-static ttft_p99")]["pass"] is None
    errors = by_line[("c128", "jaxinfer errors")]
    assert (errors["value"], errors["pass"]) == (1, False)  # 127 of 128 served
    assert by_line[("c128", "jaxinfer kv_fragmentation")]["pass"] is True
    md = compare.compare_markdown({"metadata": {"date": "d", "host": {"cpu": "c", "cpu_count": 2},
                                                "git": {"commit": None}}, "scenarios": {},
                                   "ratios": r, "acceptance": compare.acceptance(scen, r)})
    assert "| fixed | jaxinfer/llamacpp | 1.50 | 0.40 | 1.25 |" in md
    assert md.count("| FAIL |") == 2 and md.count("| not measured |") == 8  # fixed8, sharegpt x2, priority x2,
    # degradation x3


def test_degradation_acceptance_by_hand():
    compare = load_benchmark("compare")

    def run(ttft_p99_ms, ok, total=64):
        return {**entry(50.0, ttft_p99_ms, 300.0, ok=ok, total=total), "ttft_slo_s": 10.0}

    lines = lambda scen: [(a["value"], a["pass"]) for a in compare.acceptance(scen, {})  # noqa: E731
                          if a["scenario"] == "degradation"]
    met = {"degradation": {"jaxinfer": run(4000.0, ok=40), "jaxinfer-fallback": run(9500.0, ok=64)}}
    assert lines(met) == [(0, True), (pytest.approx(0.95), True), (24, True)]  # 24 refused alone
    missed = {"degradation": {"jaxinfer": run(12000.0, ok=64), "jaxinfer-fallback": run(11000.0, ok=63)}}
    assert lines(missed) == [(1, False), (pytest.approx(1.1), False), (0, True)]  # alone: 0 refused, p99 1.2x
    easy = {"degradation": {"jaxinfer": run(8000.0, ok=64), "jaxinfer-fallback": run(5000.0, ok=64)}}
    assert lines(easy)[2] == (0, False)  # the load was no overload for the primary alone
    assert lines({}) == [(None, None)] * 3


def test_priority_mix_ratios_and_acceptance_by_hand():
    compare = load_benchmark("compare")
    prio = entry(95.0, 900.0, 50.0)
    prio["classes"] = {"interactive": {**entry(20.0, 250.0, 50.0), "priority": 0},
                       "batch": {**entry(75.0, 1000.0, 50.0), "priority": 5}}
    scen = {"priority": {"jaxinfer": prio}, "priority-fcfs": {"jaxinfer": entry(100.0, 800.0, 50.0)}}
    r = compare.ratios(scen)
    assert r["priority"]["interactive/batch"]["ttft_p99"] == pytest.approx(0.25)
    assert r["priority"]["priority/fcfs"]["output_throughput"] == pytest.approx(0.95)
    by_line = {(a["scenario"], a["quantity"]): a for a in compare.acceptance(scen, r)}
    assert by_line[("priority", "interactive/batch ttft_p99")]["pass"] is True  # 0.25 <= 1/3
    assert by_line[("priority", "priority/fcfs output_throughput")]["pass"] is True  # 0.95 >= 0.95
    from jaxinfer.bench import stats

    def full(e):  # every field the markdown table reads
        base = compare.system_entry(stats.aggregate([], 1.0))
        return {**base, **e, "counts": {**base["counts"], **e["counts"]}}

    prio_full = full(prio)
    prio_full["classes"] = {k: full(v) for k, v in prio["classes"].items()}
    md = compare.compare_markdown({"metadata": {"date": "d", "host": {"cpu": "c", "cpu_count": 2},
                                                "git": {"commit": None}}, "scenarios": {"priority": {
                                                    "jaxinfer": prio_full}}, "ratios": r})
    assert "| priority | interactive/batch | 0.27 | 0.25 | 1.00 |" in md
    assert "jaxinfer interactive (priority 0, c=1)" in md and "jaxinfer batch (priority 5, c=1)" in md


def test_priority_scenarios_set_the_policy_through_the_server_flags():
    import server

    compare = load_benchmark("compare")
    a = compare.parse_args([])
    table = compare.scenarios(a)

    def policy(name):
        args = server.build_parser().parse_args(compare.server_command("jaxinfer", 8000, a, table[name])[2:])
        return server.engine_config(args, types.SimpleNamespace(max_position_embeddings=8192)).scheduler

    prio, fcfs = policy("priority"), policy("priority-fcfs")
    assert prio.scheduling_policy == "priority" and fcfs.scheduling_policy == "fcfs"
    for name, sc in (("priority", prio), ("priority-fcfs", fcfs)):  # half the clients queue
        assert table[name].clients == 2 * sc.max_num_seqs and sc.max_queue_len >= table[name].clients
    assert table["priority"].workload == table["priority-fcfs"].workload
    assert (table["priority"].workload.input_len, table["priority"].workload.output_len) == (512, 256)


def test_priority_mix_smoke_against_the_api():
    """A tiny mix against the real app (fake runner, one sequence at a time, priority
    policy): 20% interactive clients, per-class summaries, every request served, and the
    interactive class waits less for its first token."""
    import dataclasses

    from api_helpers import LiveServer, fake_engine, running_app

    from jaxinfer.engine.llm_engine import LLMEngine

    mix = load_benchmark("priority_mix")
    assert mix.split(5) == (1, 4) and mix.split(32) == (6, 26) and mix.split(1) == (1, 0)
    e = fake_engine(max_num_seqs=1, step_delay=0.003)
    sc = dataclasses.replace(e.config.scheduler, scheduling_policy="priority")
    e = LLMEngine(dataclasses.replace(e.config, scheduler=sc), e.model_config, e.runner,
                  e.block_manager.num_blocks, e.tokenizer)
    with running_app(e) as (app, _), LiveServer(app) as srv:
        cfg = load.LoadConfig(srv.url, "test-model", concurrency=5, progress=False)
        wl = WorkloadConfig(num_requests=15, input_len=8, output_len=6)
        run = mix.run_priority_mix(cfg, wl, label="mix")
    classes = run["classes"]
    assert {n: (c["priority"], c["clients"]) for n, c in classes.items()} == {"interactive": (0, 1), "batch": (5, 4)}
    assert [classes[n]["summary"]["completed"] for n in ("interactive", "batch")] == [3, 12]
    assert run["summary"]["completed"] == 15
    assert classes["interactive"]["summary"]["ttft_ms"]["mean"] < classes["batch"]["summary"]["ttft_ms"]["mean"]


def test_compare_plan_selects_systems_per_scenario():
    compare = load_benchmark("compare")
    runs = {s.name: systems for s, systems in compare.plan(compare.parse_args([]))}
    assert list(runs) == ["single", "fixed8", "fixed", "sharegpt", "c128", "defaults128", "overload", "priority",
                          "priority-fcfs", "json8"]
    assert runs["defaults128"] == ["jaxinfer", "jaxinfer-static", "llamacpp"] and "flood1024" not in runs
    flood = compare.scenarios(compare.parse_args([]))["flood1024"]
    assert (flood.clients, flood.workload.num_requests, flood.systems, flood.server_defaults) == (
        1024, 1024, ("jaxinfer",), True)
    assert runs["json8"] == ["jaxinfer"]
    assert all("llamacpp" in runs[s] for s in ("single", "fixed8", "fixed"))
    assert all("jaxinfer-static" in runs[s] for s in ("fixed", "sharegpt", "c128"))
    assert "llamacpp" not in runs["c128"] and not any("hf-transformers" in v for v in runs.values())
    chosen = compare.plan(compare.parse_args(["--systems", "llamacpp", "hf-transformers",
                                              "--scenarios", "single", "c128", "fixed"]))
    assert [(s.name, v) for s, v in chosen] == [("single", ["llamacpp"]),
                                                ("fixed", ["llamacpp", "hf-transformers"])]
    scen = {s.name: s for s, _ in compare.plan(compare.parse_args([]))}
    single = scen["single"]
    assert (single.clients, single.workload.input_len, single.workload.output_len) == (1, 128, 128)
    assert (scen["fixed8"].clients, scen["fixed"].clients, scen["c128"].clients) == (8, 32, 128)
    assert scen["c128"].workload.num_requests >= 128
    json8 = scen["json8"]  # fixed8 with a schema on every request, sent only to jaxinfer
    assert (json8.clients, json8.workload) == (8, scen["fixed8"].workload)
    assert compare._extra_body("jaxinfer", json8) == {
        "structured_outputs": {"json": compare.compare_scenarios.JSON8_SCHEMA}}
    assert compare._extra_body("jaxinfer", single) is None


def test_compare_degradation_runs_overload_with_and_without_a_fallback():
    """The degradation scenario through server.py's own flag parsing: the same primary (name,
    pool, short queue) in both runs, plus a fallback model with its own pool and the SLO;
    fallback_share reads the server's per-model success counters."""
    import server

    compare = load_benchmark("compare")
    a = compare.parse_args(["--scenarios", "degradation", "--degrade-ttft-slo-s", "2.5"])
    (scen, systems), = compare.plan(a)
    assert systems == ["jaxinfer", "jaxinfer-fallback"] and scen.clients == 4 * a.concurrency
    assert (scen.workload.num_requests, scen.workload.input_len, scen.workload.output_len) == (
        2 * a.num_requests, a.degradation_input_len, a.degradation_output_len)  # a burst: every client at once
    parse = lambda system: server.build_parser().parse_args(compare.server_command(system, 8000, a, scen)[2:])  # noqa: E731
    alone, with_fallback = parse("jaxinfer"), parse("jaxinfer-fallback")
    assert [s.name for s in server.served_specs(alone)] == [a.model]
    specs = server.served_specs(with_fallback)
    assert [(s.path, s.name) for s in specs] == [(a.model, a.model), (a.model, "fallback")]
    assert (with_fallback.fallback_model, with_fallback.degrade_ttft_slo) == ("fallback", 2.5)
    assert alone.num_blocks == with_fallback.num_blocks == compare.num_blocks(scen, a)
    assert alone.max_queue_len == with_fallback.max_queue_len == a.overload_queue_len
    assert "degradation" not in [s.name for s, _ in compare.plan(compare.parse_args([]))]  # only when named
    text = ('# TYPE jaxinfer_request_success counter\n'
            'jaxinfer_request_success_total{model_name="m",finished_reason="length"} 3.0\n'
            'jaxinfer_request_success_total{model_name="m",finished_reason="abort"} 5.0\n'
            'jaxinfer_request_success_total{model_name="fallback",finished_reason="stop"} 1.0\n')
    assert compare.fallback_share(text) == 1 / 4
    assert compare.fallback_share("") is None


def test_compare_jaxinfer_commands_share_the_kv_budget():
    """c128 through server.py's own flag parsing: both modes get one pool that holds all 128
    requests; static batching's max_model_len reservations fit fewer; continuous batching
    runs with the server's defaults but for what the scenario needs."""
    import server

    compare = load_benchmark("compare")
    a = compare.parse_args([])
    scen = compare.scenarios(a)["c128"]

    def config(system, s=scen):
        args = server.build_parser().parse_args(compare.server_command(system, 8000, a, s)[2:])
        return server.engine_config(args, types.SimpleNamespace(max_position_embeddings=8192))

    cont, static = config("jaxinfer"), config("jaxinfer-static")
    assert cont.cache.num_blocks == static.cache.num_blocks
    pool_tokens = (cont.cache.num_blocks - 1) * 16
    assert pool_tokens >= 128 * (512 + 256)
    assert pool_tokens // static.scheduler.max_model_len < 128  # static preallocates max_model_len
    assert (cont.scheduler.max_num_seqs, static.scheduler.max_num_seqs) == (128, 128)
    assert (cont.scheduler.scheduler, static.scheduler.scheduler) == ("continuous", "static")
    assert not cont.cache.enable_prefix_caching and not static.cache.enable_prefix_caching
    defaults = server.engine_config(server.build_parser().parse_args(["--max-model-len", "1024"]),
                                    types.SimpleNamespace(max_position_embeddings=8192))
    fixed8 = config("jaxinfer", compare.scenarios(a)["fixed8"])
    assert fixed8.scheduler.max_num_seqs == defaults.scheduler.max_num_seqs
    assert fixed8.scheduler.max_num_batched_tokens == defaults.scheduler.max_num_batched_tokens
    assert fixed8.cache.num_blocks is None and fixed8.cache.watermark == defaults.cache.watermark


def test_compare_llamacpp_command_and_no_outside_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMACPP_HOME", str(tmp_path / "cache"))
    compare = load_benchmark("compare")
    a = compare.parse_args([])
    a.llamacpp = (tmp_path / "cache" / "llama.cpp" / "build" / "bin" / "llama-server", tmp_path / "cache" / "m.gguf")
    cmd = compare.server_command("llamacpp", 8123, a, compare.scenarios(a)["fixed"])
    def flag(name):
        return cmd[cmd.index(name) + 1]

    assert [flag(f) for f in ("-np", "-c", "--port", "-a")] == ["32", str(32 * 1024), "8123", a.model]
    assert "--cont-batching" in cmd and "--metrics" in cmd
    shown = compare.display_command(cmd)
    assert shown.startswith("$LLAMACPP_HOME/llama.cpp/build/bin/llama-server -m $LLAMACPP_HOME/m.gguf ")
    assert str(tmp_path) not in shown
    jax_cmd = compare.display_command(compare.server_command("jaxinfer", 8000, a, compare.scenarios(a)["fixed"]))
    assert jax_cmd.startswith("python ./server.py --port 8000 ") and str(compare.ROOT) not in jax_cmd


def test_llamacpp_build_reports_missing_tools(tmp_path, monkeypatch):
    peer = load_benchmark("llamacpp_peer")
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))  # no cmake, no compiler
    said = []
    assert peer.ensure_llamacpp(tmp_path / "cache", log=said.append) is None
    assert "missing cmake, a C++ compiler" in said[-1]


def test_llamacpp_build_is_cached(tmp_path, monkeypatch):
    """Built binaries and the F16 file are reused: nothing runs (PATH is empty)."""
    peer = load_benchmark("llamacpp_peer")
    root = tmp_path / "cache"
    bindir = root / "llama.cpp" / "build" / "bin"
    bindir.mkdir(parents=True)
    for name in ("llama-server", "llama-quantize"):
        (bindir / name).write_text("")
    src = tmp_path / "model.Q4_1.gguf"
    (root / "model.Q4_1.F16.gguf").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert peer.ensure_llamacpp(root, source_gguf=src, log=print) == (bindir / "llama-server",
                                                                      root / "model.Q4_1.F16.gguf")


def test_running_server_waits_for_health_and_stops_it(tmp_path):
    """`llamacpp_peer.running` on a stand-in server that is unhealthy (503) for its first 1 s."""
    import httpx

    peer = load_benchmark("llamacpp_peer")
    script = tmp_path / "srv.py"
    script.write_text(
        "import http.server, sys, time\n"
        "t0 = time.monotonic()\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200 if time.monotonic() - t0 > 1.0 else 503); self.end_headers()\n"
        "http.server.HTTPServer(('127.0.0.1', int(sys.argv[2])), H).serve_forever()\n")
    port = peer.free_port()
    t0 = time.monotonic()
    with peer.running([sys.executable, str(script), "--port", str(port)], tmp_path / "log.txt", 30.0) as url:
        assert time.monotonic() - t0 > 1.0
        assert httpx.get(url + "/health").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/health")
    with pytest.raises(RuntimeError, match="exited with status 3"):
        with peer.running([sys.executable, "-c", "raise SystemExit(3)", "--port", "1"], None, 30.0):
            pass


@pytest.mark.skipif(not (load_benchmark("llamacpp_peer").home() / "llama.cpp" / "build" / "bin"
                         / "llama-server").is_file(), reason="llama.cpp not built (benchmarks/llamacpp_peer.py)")
def test_llamacpp_server_answers_the_load_generator(tmp_path):
    """The real llama-server (when built): exact output lengths with token-id prompts."""
    peer = load_benchmark("llamacpp_peer")
    built = peer.ensure_llamacpp()
    assert built is not None
    with peer.llama_server(*built, parallel=2, ctx_per_slot=256, log_path=tmp_path / "log.txt") as url:
        cfg = load.LoadConfig(url, peer.SERVED_NAME, concurrency=2, extra_body=peer.REQUEST_EXTRA, progress=False)
        wl = WorkloadConfig(name="fixed", num_requests=2, input_len=32, output_len=8)
        results, _ = asyncio.run(load.run(cfg, workloads.build_requests(wl)))
    assert [r.outcome for r in results] == ["ok", "ok"], [r.error for r in results]
    assert [(r.prompt_tokens, r.output_tokens) for r in results] == [(32, 8), (32, 8)]


def test_cpu_busy_fraction_sees_a_busy_core():
    """One spinning process: at least ~1 / cores of the CPU is busy (idle machine: ~0)."""
    import multiprocessing
    import os

    if not Path("/proc/stat").exists():
        pytest.skip("no /proc/stat")
    machine_info = load_benchmark("machine_info")
    proc = multiprocessing.get_context("spawn").Process(target=_spin, args=(3.0,))
    proc.start()
    try:
        time.sleep(0.5)
        busy = machine_info.cpu_busy_fraction(1.0)
    finally:
        proc.join()
    assert 0.8 / os.cpu_count() <= busy <= 1.0


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_llamacpp_source_gguf_follows_the_model():
    """llama.cpp serves the GGUF jaxinfer converts for the same ``--model``; other names are refused."""
    peer = load_benchmark("llamacpp_peer")
    assert peer.source_gguf("smollm2-135m-instruct").name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(ValueError, match="no GGUF known"):
        peer.source_gguf("weights/my-checkpoint")


def test_priority_mix_warms_both_classes_then_starts_batch_before_interactive(monkeypatch):
    """Both warm-ups end before any measured request; the interactive clients start after
    the batch ones (submitted first they would lead the queue under FCFS too)."""
    mix = load_benchmark("priority_mix")
    events = []

    async def fake_run(cfg, requests, warmup=()):
        kind = "warm" if warmup else "measured"
        events.append((kind, cfg.extra_body["priority"], time.monotonic()))
        return [], 0.0

    monkeypatch.setattr(mix.load, "run", fake_run)
    monkeypatch.setattr(mix, "INTERACTIVE_DELAY_S", 0.05)
    cfg = load.LoadConfig("http://x", "m", concurrency=10)
    out = asyncio.run(mix._run_classes(cfg, list(range(10)), list(range(4))))
    assert set(out) == {"interactive", "batch"}
    assert [e[0] for e in events] == ["warm", "warm", "measured", "measured"]
    measured = {prio: t for kind, prio, t in events if kind == "measured"}
    assert measured[5] < measured[0] and measured[0] - measured[5] >= 0.04


def test_headline_scene_runs_jaxinfer_on_server_defaults_beside_static():
    """defaults128 (issue 50): jaxinfer gets no sizing, queue or tuning flag; static batching keeps
    its own flags and, like jaxinfer, the default KV pool."""
    import server

    compare = load_benchmark("compare")
    a = compare.parse_args(["--jaxinfer-args", "--watermark 0.05", "--max-num-batched-tokens", "256"])
    scen = compare.scenarios(a)["defaults128"]
    assert (scen.clients, scen.workload.input_len, scen.workload.output_len) == (128, 512, 256)
    cmd = compare.server_command("jaxinfer", 8000, a, scen)
    assert cmd[2:] == ["--port", "8000", "--model", a.model, "--shutdown-timeout", "5", "--log-level", "warning"]
    args = server.build_parser().parse_args(compare.server_command("jaxinfer-static", 8000, a, scen)[2:])
    assert (args.scheduler, args.max_num_seqs, args.num_blocks, args.watermark) == ("static", 128, None, 0.05)
    overload = compare.server_command("jaxinfer", 8000, a, compare.scenarios(a)["overload"])
    assert overload[overload.index("--max-num-seqs") + 1] == str(a.concurrency)  # excess clients queue for a slot


def test_errors_by_kind_and_defaults128_acceptance():
    sc = load_benchmark("compare_scenarios")
    reqs = [{"outcome": "ok"}, {"outcome": "http_429", "error": '{"error": {"code": "queue_full"}}'},
            {"outcome": "http_429", "error": '{"error": {"code": "queue_wait_expired"}}'},
            {"outcome": "http_429", "error": ""}, {"outcome": "http_5xx"}, {"outcome": "timeout"}]
    kinds = sc.errors_by_kind(reqs)
    assert {k: v for k, v in kinds.items() if v} == {"queue_full": 1, "queue_wait_expired": 1, "http_429_other": 1,
                                                     "http_5xx": 1, "client_timeout": 1}
    defaults = {"counts": {"total": 128, "ok": 128}, "kv_fragmentation": 0.01, "output_throughput_tok_s": 700.0,
             "errors_by_kind": dict.fromkeys(sc.ERROR_KINDS, 0)}
    fixed = {"counts": {"total": 128, "ok": 128}, "output_throughput_tok_s": 627.0}
    lines = sc.defaults128_acceptance({"defaults128": {"jaxinfer": defaults}, "fixed": {"jaxinfer": fixed}})
    assert [ln["pass"] for ln in lines] == [True, True, True, None, None]  # the flood was not run
    assert [ln["pass"] for ln in sc.defaults128_acceptance({})] == [None] * 5
    refused = [{"outcome": "http_429", "error": "queue_full", "retry_after": 41.0}] * 3
    flood = {"errors_by_kind": sc.errors_by_kind(refused + reqs[:1]),
             **sc.flood_fields(refused, {"kv_blocks_free": 10.0, "kv_blocks_total": 10.0})}
    assert [ln["pass"] for ln in sc.defaults128_acceptance({"flood1024": {"jaxinfer": flood}})][3:] == [True, True]
    flood = {"errors_by_kind": kinds, **sc.flood_fields(reqs, {"kv_blocks_free": 9.0,
                                                               "kv_blocks_total": 10.0})}
    lines = sc.defaults128_acceptance({"flood1024": {"jaxinfer": flood}})[3:]
    assert [(ln["value"], ln["pass"]) for ln in lines] == [(5, False), (0, False)]  # 5xx, time-out, 3 x no Retry-After
    assert "No request failed" in sc.errors_markdown({"defaults128": {"jaxinfer": defaults}})
    # the names a run records: jaxinfer.bench.metadata.parse_metrics of the server's /metrics
    from jaxinfer.bench.metadata import parse_metrics
    after = parse_metrics("jaxinfer_kv_blocks_free 7.0\njaxinfer_kv_blocks_total 7.0\n")
    assert sc.flood_fields([], after)["kv_idle_after"] is True
    md = sc.errors_markdown({"overload": {"jaxinfer": {"errors_by_kind": kinds}}})
    assert "| overload | jaxinfer | 1 | 1 | 1 | 0 | 1 | 1 | 0 | 0 |" in md
