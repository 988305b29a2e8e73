"""The serving comparison: jaxinfer (continuous batching) vs jaxinfer (static batching, same
engine, same KV budget) vs llama.cpp's server (F16 GGUF of the same weights, CPU) and,
optionally, Hugging Face transformers (static batches), in one run on this machine.

Scenarios (closed loop; prompts are random token ids; ``ignore_eos`` so lengths are exact):
  * ``single``: 1 client, 128-token prompts, 128-token outputs (latency of one stream).
  * ``fixed8``: 8 clients, 512 / 256.
  * ``fixed``: ``--concurrency`` (32) clients, 512 / 256.
  * ``sampled`` (run when named): ``fixed`` with temperature 1 and top_p 0.95 instead of greedy
    requests, as OpenAI-style clients ask by default.
  * ``sharegpt``: same clients, ShareGPT-like lognormal lengths (`jaxinfer.bench.workloads`),
    prompts <= 512 and outputs <= 511 tokens.
  * ``c128``: 128 clients, 512 / 256; the KV pool holds all 128 (continuous batching should
    serve every one of them; static batching reserves ``max_model_len`` per member, so only
    ``pool / max_model_len`` of them fit and the rest fail with 503).
  * ``defaults128``: the design's headline scene, ``c128``'s load against jaxinfer on ``server.py``'s
    defaults alone (no ``--max-num-seqs``, queue, KV or ``--jaxinfer-args`` flags), beside
    static batching (its usual flags, the default KV pool) and llama.cpp; its acceptance lines
    (issue 50): 0 failed requests, fragmentation <= 2%, output tok/s >= ``fixed``'s.
  * ``flood1024`` (only when named): 1,024 clients, 512 / 256, jaxinfer on server defaults: far
    beyond capacity, every request answered or refused at once with 429 + Retry-After (no
    5xx, no client time-out), the KV pool idle after.
  * ``overload``: 4x the clients the KV pool holds, ``fixed``'s lengths, short queue.
  * ``priority``: ``sharegpt``'s lengths (varied lengths free slots one at a time; with
    fixed lengths every slot frees in the same step, and a queue policy can only pick the
    next wave), twice its clients against ``--max-num-seqs`` =
    ``--concurrency`` (so half of them queue: priority orders the queue, it cannot help
    when everything runs at once), 20% of the clients interactive (``"priority": 0``) and
    80% batch (``"priority": 5``), against a server with ``--scheduling-policy priority``;
    TTFT per class (`benchmarks/priority_mix.py`).
  * ``priority-fcfs``: the same mix against the default FCFS server (the reference for
    the priority run's throughput and per-class TTFT).
  * ``degradation`` (only when named in ``--scenarios``): a burst of ``2 x --num-requests``
    requests (``--degradation-input-len`` / ``--degradation-output-len``: 32 / 128, short
    enough that a 2-core CPU prefills the whole burst well within a 10 s SLO) from
    ``overload``'s clients, against ``overload``'s short queue: twice the sequence slots of
    one model, so jaxinfer alone turns requests away (or they wait for a running request
    to finish). Run on jaxinfer alone and on ``jaxinfer-fallback``, the same server plus
    ``--fallback-model`` (default: the same model, served a second time under the name
    ``fallback``, with its own slots and KV pool) and ``--degrade-ttft-slo``
    (``--degrade-ttft-slo-s``). Reports P99 TTFT, 429 counts, ``fallback_share``: the share
    of requests the fallback answered (from the server's ``jaxinfer_request_success_total``
    per model at the end of the run, warm-up included), and the acceptance lines.
  * ``json8``: ``fixed8`` with every request constrained to a JSON schema (an array of at
    least `JSON8_MIN_ITEMS` objects, so each answer runs to its full length like
    ``fixed8``'s): structured-output throughput against ``fixed8``'s unconstrained one
    (jaxinfer only; the per-step host cost of the mask is `benchmarks/grammar_mask.py`'s).
  * ``grounded1`` (only when named): 1 client, input-grounded prompts (`jaxinfer.bench.grounded`: rewrite or
    continue a passage, edit code; ``--grounded-input-len`` / ``--grounded-output-len``),
    ``jaxinfer`` against ``jaxinfer-spec`` (the same server with ``--speculative-config``,
    n-gram prompt lookup by default): the TPOT speculation buys a lone stream. ``fixed``
    also runs ``jaxinfer-spec`` when it is selected (speculation must not cost throughput
    at 32 clients).
`SCENARIOS` says which systems run which scenario; ``--systems`` / ``--scenarios`` select.
Queues: every scenario but overload and degradation lets clients wait (``--timeout-s``);
those keep a short queue (``--overload-queue-len``, ``--max-queue-wait``) so excess clients get 429.

Servers. jaxinfer runs ``server.py`` with its defaults plus what a scenario needs:
``--max-model-len`` (1024), ``--no-prefix-caching``, queue limits, ``--max-num-seqs`` = the clients the
pool holds when that is more than ``--concurrency`` (c128), for overload and degradation (so
excess clients queue for a slot, as those scenarios mean) and the priority mix (static batching:
always, it is the batch size), and, where both jaxinfer modes run, the same ``--num-blocks`` for
both: enough for the scenario's clients at its longest request (+ the null block). llama.cpp
(built by `llamacpp_peer`, skipped with a printed reason if it cannot be built) gets ``-np`` =
the scenario's clients, ``-c`` = clients x ``max_model_len`` and all CPU threads; requests to it
carry ``cache_prompt: false`` (no prefix reuse). Every (scenario, system) gets a fresh server on
127.0.0.1, so the KV fragmentation gauge covers that scenario only (warm-up included).

Writes ``benchmarks/results/<date>-<device>/``: ``compare.json`` (per scenario and system:
the command line, output_throughput_tok_s, ttft_ms / tpot_ms / itl_ms / e2el_ms with mean,
p50, p95, p99, kv_fragmentation, request counts by outcome, ``errors_by_kind`` (429
``queue_full`` / ``queue_wait_expired``, 4xx, 5xx, client time-out, ...), ``cpu_busy_before``:
the share of the CPU other work used just before the server started, flagged in compare.md above
``compare_report.BUSY_CPU``; then ``ratios`` and ``acceptance``, computed by
`benchmarks/compare_report.py`), ``compare.md`` (README tables), per-run JSON /
markdown / CDF plots under ``runs/``, one CDF plot per scenario, server logs under ``logs/``.
Full run: ``make bench`` (``python benchmarks/compare.py``); smoke run: ``--quick``.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # this checkout's jaxinfer, not another installed copy
    sys.path.insert(0, str(HERE.parent))


def _sibling(name: str):
    """``benchmarks/<name>.py`` as a module (benchmarks/ is not a package; its folder stays off sys.path)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


llamacpp_peer = _sibling("llamacpp_peer")
compare_report = _sibling("compare_report")
priority_mix = _sibling("priority_mix")
compare_scenarios = _sibling("compare_scenarios")
machine_info = _sibling("machine_info")
ratios, acceptance, compare_markdown, fallback_share = (  # noqa: E402
    compare_report.ratios, compare_report.acceptance, compare_report.compare_markdown, compare_report.fallback_share)
Scenario, scenarios, num_blocks, queue_limits = (compare_scenarios.Scenario, compare_scenarios.scenarios,
                                                 compare_scenarios.num_blocks, compare_scenarios.queue_limits)
SCENARIOS, DEFAULT_SCENARIOS, PRIORITY_SCENARIOS, FALLBACK_NAME = (
    compare_scenarios.SCENARIOS, compare_scenarios.DEFAULT_SCENARIOS, compare_scenarios.PRIORITY_SCENARIOS,
    compare_scenarios.FALLBACK_NAME)
device_label, gpu_info, cpu_busy_fraction = (machine_info.device_label, machine_info.gpu_info,
                                            machine_info.cpu_busy_fraction)

from jaxinfer.bench import load, metadata, report  # noqa: E402
from jaxinfer.bench.serve import run_benchmark  # noqa: E402
from jaxinfer.config import ModelConfig  # noqa: E402
from jaxinfer.platform.dtype import auto_dtype

ROOT = HERE.parent
TARGET_NUM_REQUESTS = 128
SYSTEMS = ("jaxinfer", "jaxinfer-static", "jaxinfer-before", "jaxinfer-fallback", "jaxinfer-spec", "llamacpp", "llamacpp-q8_0",
           "hf-transformers")
DEFAULT_SYSTEMS = ("jaxinfer", "jaxinfer-static", "jaxinfer-fallback", "llamacpp")  # transformers: ~15 min more per scenario


def jaxinfer_command(system: str, port: int, a, scen: Scenario) -> list[str]:
    """``server.py`` for one scenario: server defaults plus what the scenario needs (module docstring)."""
    if scen.server_defaults and system == "jaxinfer":
        return [sys.executable, str(a.server_script), "--port", str(port), "--model", a.model,
                "--shutdown-timeout", "5", "--log-level", "warning"]
    queue_len, queue_wait = queue_limits(scen, a)
    before = system == "jaxinfer-before"
    script = (a.before_server_script or a.server_script) if before else a.server_script
    cmd = [sys.executable, str(script), "--port", str(port), "--model", a.model,
           "--max-model-len", str(a.max_model_len), "--no-prefix-caching",
           "--max-queue-len", str(queue_len), "--max-queue-wait", str(queue_wait),
           "--shutdown-timeout", "5", "--log-level", "warning"]
    if system == "jaxinfer-fallback":
        cmd += ["--served-model-name", a.model, "--model", a.fallback_model or a.model,
                "--served-model-name", FALLBACK_NAME, "--fallback-model", FALLBACK_NAME,
                "--degrade-ttft-slo", str(a.degrade_ttft_slo_s)]
    if system == "jaxinfer-spec":
        cmd += ["--speculative-config", a.speculative_config]
    if system == "jaxinfer-static":
        cmd += ["--scheduler", "static", "--max-num-seqs", str(scen.pool_clients)]
    elif scen.pool_clients > a.concurrency or scen.overloaded or scen.name in PRIORITY_SCENARIOS:
        cmd += ["--max-num-seqs", str(scen.pool_clients)]  # slots = what the pool holds: overload queues for a slot
    if scen.same_kv_budget:
        cmd += ["--num-blocks", str(num_blocks(scen, a))]
    if scen.name == "priority":
        cmd += ["--scheduling-policy", "priority"]
    if a.max_num_batched_tokens:
        cmd += ["--max-num-batched-tokens", str(a.max_num_batched_tokens)]
    return cmd + shlex.split(a.jaxinfer_args) + (shlex.split(a.before_jaxinfer_args) if before else [])


def server_command(system: str, port: int, a, scen: Scenario) -> list[str]:
    """The command line that starts ``system`` on ``port`` for ``scen``."""
    if system.startswith("llamacpp"):
        server, gguf = a.llamacpp
        gguf = a.llamacpp_q8_0 if system == "llamacpp-q8_0" else gguf
        return llamacpp_peer.server_command(server, gguf, port, scen.clients, a.max_model_len, a.llamacpp_threads,
                                            served_name=a.model)
    if system == "hf-transformers":
        queue_len, _ = queue_limits(scen, a)
        return [sys.executable, str(HERE / "hf_server.py"), "--port", str(port),
                "--max-batch-size", str(scen.pool_clients), "--batch-timeout-s", str(a.batch_timeout_s),
                "--served-model-name", a.model, "--max-queue-len", str(queue_len)] + (
                    ["--threads", str(a.hf_threads)] if a.hf_threads else [])
    return jaxinfer_command(system, port, a, scen)


def display_command(cmd: list[str]) -> str:
    """``cmd`` as one shell line, with this checkout shown as ``.``, the llama.cpp cache as
    ``$LLAMACPP_HOME`` and the Python interpreter as ``python`` (results name no outside path)."""
    swaps = [(sys.executable, "python"), (str(llamacpp_peer.home()), "$LLAMACPP_HOME"), (str(ROOT), ".")]
    out = []
    for part in cmd:
        for old, new in swaps:
            if part == old or part.startswith(old + os.sep):
                part = new + part[len(old):]
                break
        out.append(part)
    return " ".join(p if p.startswith("$LLAMACPP_HOME") else shlex.quote(p) for p in out)


def system_info(system: str, cmd: list[str]) -> dict:
    """What the metadata records about a server under test."""
    if system == "hf-transformers":
        engine = {"backend": "transformers generate (torch, eager)", "dtype": "float32", "batching": "static"}
    elif system.startswith("llamacpp"):
        weights = ("Q8_0 weights (int8, a float16 scale per 32; Q8_0 GGUF of the same GGUF checkpoint jaxinfer "
                   "converts)" if system == "llamacpp-q8_0" else
                   "float16 weights (F16 GGUF of the same GGUF checkpoint jaxinfer converts)")
        engine = {"backend": f"llama.cpp llama-server (CPU build, GGML_NATIVE; vendored in llama-cpp-python "
                             f"{llamacpp_peer.LLAMA_CPP_PYTHON_VERSION})",
                  "dtype": f"{weights}, float16 KV",
                  "batching": "continuous (-np slots)", "request_extra": llamacpp_peer.REQUEST_EXTRA}
    else:
        rule = "the earlier checkout's rule" if system == "jaxinfer-before" else f"on this CPU: {auto_dtype('cpu')}"
        dtype = cmd[cmd.index("--dtype") + 1] if "--dtype" in cmd else f"auto ({rule})"
        engine = {"backend": "jaxinfer (attention: server default, pallas on GPU / xla otherwise)", "dtype": dtype,
                  "batching": "static" if system == "jaxinfer-static" else "continuous"}
    if system == "jaxinfer-before":
        engine["git"] = metadata.git_commit(Path(cmd[1]).resolve().parent)  # the earlier checkout's commit
    return {"system": system, "command": display_command(cmd), "device": device_label(), "gpu": gpu_info(), **engine}


def system_entry(summary: dict) -> dict:
    """The compare.json fields of one (scenario, system)."""
    def pick(d: dict) -> dict:
        return {"mean": d["mean"], "p50": d["median"], "median": d["median"], "p95": d["p95"], "p99": d["p99"]}

    return {"output_throughput_tok_s": summary["output_throughput_tok_s"],
            "request_throughput_req_s": summary["request_throughput_req_s"],
            "goodput_req_s": summary["goodput_req_s"],
            **{k: pick(summary[k]) for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")},
            "kv_fragmentation": summary.get("kv_fragmentation"), "counts": summary["counts"],
            "duration_s": summary["duration_s"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=SYSTEMS)
    p.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS), choices=SCENARIOS)
    p.add_argument("--hf-scenarios", nargs="+", default=["fixed"], choices=SCENARIOS,
                   help="scenarios hf-transformers runs when it is in --systems")
    p.add_argument("--concurrency", type=int, default=32, help="clients of fixed / sharegpt (overload: 4x)")
    p.add_argument("--num-requests", type=int, default=64,
                   help=f"measured requests per scenario (overload: twice; c128: at least 128); "
                        f"the target is {TARGET_NUM_REQUESTS}")
    p.add_argument("--single-requests", type=int, default=16, help="measured requests of the 1-client scenario")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--single-input-len", type=int, default=128)
    p.add_argument("--single-output-len", type=int, default=128)
    p.add_argument("--grounded-input-len", type=int, default=400, help="grounded1: passage tokens (at most)")
    p.add_argument("--grounded-output-len", type=int, default=200)
    p.add_argument("--speculative-config", default='{"method": "ngram", "num_speculative_tokens": 3, '
                   '"prompt_lookup_max": 4, "prompt_lookup_min": 2}', help="system jaxinfer-spec's --speculative-config")
    p.add_argument("--warmup-requests", type=int, default=4)
    p.add_argument("--max-model-len", type=int, default=1024, help="jaxinfer; also llama.cpp's context per slot")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, help="jaxinfer (default: the server's)")
    p.add_argument("--jaxinfer-args", default="", help="extra server.py flags for both jaxinfer systems "
                   "(policy experiments; recorded in each command line)")
    p.add_argument("--max-queue-len", type=int, default=256)
    p.add_argument("--max-queue-wait", type=float, default=30.0,
                   help="jaxinfer, overload scenario: seconds queued before 429 (others wait --timeout-s)")
    p.add_argument("--overload-queue-len", type=int, default=8, help="overload scenario: waiting requests before 429")
    p.add_argument("--overload-max-retries", type=int, default=0,
                   help="overload scenario: clients resend a 429 after its Retry-After up to this many times")
    p.add_argument("--fallback-model", default=None,
                   help="degradation scenario: the fallback model (default: --model, served a second time)")
    p.add_argument("--degrade-ttft-slo-s", type=float, default=None,
                   help="degradation scenario: the server's --degrade-ttft-slo (default: --slo-ttft-ms)")
    p.add_argument("--degradation-input-len", type=int, default=32, help="degradation scenario: prompt tokens")
    p.add_argument("--degradation-output-len", type=int, default=128, help="degradation scenario: output tokens")
    p.add_argument("--llamacpp-threads", type=int, default=None, help="llama.cpp -t / -tb (default: CPU count)")
    p.add_argument("--batch-timeout-s", type=float, default=0.1, help="hf-transformers: batch formation wait")
    p.add_argument("--hf-threads", type=int, default=None, help="hf-transformers: torch threads (default torch's)")
    p.add_argument("--slo-ttft-ms", type=float, default=10_000.0)
    p.add_argument("--slo-tpot-ms", type=float, default=500.0)
    p.add_argument("--timeout-s", type=float, default=900.0, help="client-side limit per request")
    p.add_argument("--startup-timeout-s", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--server-script", type=Path, default=ROOT / "server.py", help="jaxinfer server entry point")
    p.add_argument("--before-server-script", type=Path, default=None,
                   help="server.py of an earlier checkout (e.g. a git worktree): runs as system jaxinfer-before, "
                        "same flags, for a before/after comparison in one run")
    p.add_argument("--before-jaxinfer-args", default="",
                   help="extra server.py flags for jaxinfer-before only; with no --before-server-script it runs "
                        "this checkout's server.py (e.g. '--dtype bfloat16' against the default in one run)")
    p.add_argument("--out", default=None, help="default benchmarks/results/<date>-<device>")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: clients / 8, 8 requests (single: 2), 64/16 and 32/16 tokens")
    a = p.parse_args(argv)
    if a.degrade_ttft_slo_s is None:
        a.degrade_ttft_slo_s = a.slo_ttft_ms / 1000
    if a.quick:
        a.concurrency, a.num_requests, a.input_len, a.output_len, a.warmup_requests = 4, 8, 64, 16, 1
        a.single_requests, a.single_input_len, a.single_output_len, a.max_model_len = 2, 32, 16, 256
    return a


def run_one(system: str, scen: Scenario, a, out: Path) -> tuple[dict, str]:
    """Start ``system``'s server for ``scen``, run the load, stop it; (compare.json entry, run label)."""
    cmd = server_command(system, llamacpp_peer.free_port(), a, scen)
    label = f"{scen.name}-{system}"
    busy_cpu = cpu_busy_fraction()  # before our server starts: other work on this machine
    print(f"== {label}: {scen.clients} clients, {scen.workload.num_requests} requests\n   {display_command(cmd)}",
          flush=True)
    with llamacpp_peer.running(cmd, out / "logs" / f"{label}.log", a.startup_timeout_s) as url:
        cfg = load.LoadConfig(url, a.model, concurrency=scen.clients, timeout_s=a.timeout_s, seed=a.seed,
                              max_retries=a.overload_max_retries if scen.overloaded else 0,
                              extra_body=_extra_body(system, scen))
        bench = priority_mix.run_priority_mix if scen.name in PRIORITY_SCENARIOS else run_benchmark
        run = bench(cfg, scen.workload, label=label, out_dir=out / "runs", warmup_requests=a.warmup_requests,
                    slo_ttft_ms=a.slo_ttft_ms, slo_tpot_ms=a.slo_tpot_ms, server_info=system_info(system, cmd))
        share = fallback_share(httpx.get(f"{url}/metrics", timeout=30).text) if system == "jaxinfer-fallback" else None
    rows = [(label, run["summary"])] + [(f"{label} {name}", c["summary"]) for name, c in run.get("classes", {}).items()]
    print(report.markdown_table(rows), flush=True)
    entry = {"concurrency": scen.clients, "command": display_command(cmd), **system_entry(run["summary"]),
             "errors_by_kind": compare_scenarios.errors_by_kind(run["requests"]), "cpu_busy_before": busy_cpu,
             **compare_scenarios.flood_fields(run["requests"], run["metadata"]["server_after"]["metrics"])}
    if "classes" in run:
        entry["classes"] = {name: {"priority": c["priority"], "concurrency": c["clients"],
                                   **system_entry(c["summary"])} for name, c in run["classes"].items()}
    if share is not None:
        entry["fallback_share"] = share
    if scen.name == "degradation":
        entry["ttft_slo_s"] = a.degrade_ttft_slo_s  # what compare_report.degradation_acceptance compares with
    return entry, label


def _extra_body(system: str, scen: Scenario) -> dict | None:
    """Request fields for ``system`` in ``scen``: llama.cpp's, then the scenario's."""
    extra = dict(llamacpp_peer.REQUEST_EXTRA) if system.startswith("llamacpp") else {}
    extra.update(scen.extra_body or {})
    return extra or None


def plan(a) -> list[tuple[Scenario, list[str]]]:
    """(scenario, systems to run) in order, from ``--scenarios`` / ``--systems`` / ``--hf-scenarios``."""
    table = scenarios(a)
    out = []
    for name in a.scenarios:
        scen = table[name]
        systems = [s for s in a.systems if s in scen.systems and (s != "hf-transformers" or name in a.hf_scenarios)]
        if systems:
            out.append((scen, systems))
    return out


def main(argv=None) -> dict:
    a = parse_args(argv)
    t_start = time.monotonic()
    name = f"{datetime.date.today()}-{device_label()}{'-quick' if a.quick else ''}"
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / name
    todo = plan(a)
    llama_note = prepare_llamacpp(a, todo)
    kv_block_bytes = 16 * ModelConfig.from_dir(ROOT / "weights" / a.model).kv_bytes_per_token  # float32
    meta = metadata.collect(a.model, {"device": device_label(), "gpu": gpu_info()})
    meta.update(settings={k: display_command([str(v)]) if isinstance(v, Path) else v
                          for k, v in vars(a).items() if k not in ("llamacpp", "llamacpp_q8_0")}, quick=a.quick, llamacpp=llama_note,
                kv_budget={sc.name: {"num_blocks": num_blocks(sc, a),
                                     "bytes_float32": (num_blocks(sc, a) - 1) * kv_block_bytes,
                                     "holds": f"{sc.pool_clients} requests of {a.input_len}+{a.output_len} tokens"}
                           for sc, _ in todo if sc.same_kv_budget},
                scaled_down={"target_num_requests": TARGET_NUM_REQUESTS, "num_requests": a.num_requests,
                             "why": "128 requests per scenario take too long on a 2-core CPU"}
                if a.num_requests < TARGET_NUM_REQUESTS else None)
    result = {"metadata": meta, "scenarios": {}}
    for scen, systems in todo:
        per_system, labels = {}, []
        for system in systems:
            if (system.startswith("llamacpp") and a.llamacpp is None) or (
                    system == "llamacpp-q8_0" and a.llamacpp_q8_0 is None) or (
                    system == "jaxinfer-before" and a.before_server_script is None and not a.before_jaxinfer_args):
                continue
            per_system[system], label = run_one(system, scen, a, out)
            labels.append((system, label))
        if per_system:
            result["scenarios"][scen.name] = per_system
            _write_scenario_plot(out, scen.name, labels)
    result["ratios"] = ratios(result["scenarios"])
    result["acceptance"] = (acceptance(result["scenarios"], result["ratios"])
                            + compare_scenarios.defaults128_acceptance(result["scenarios"]))
    meta["elapsed_s"] = time.monotonic() - t_start
    report.write_json(out / "compare.json", result)
    (out / "compare.md").write_text(compare_markdown(result) + compare_scenarios.errors_markdown(result["scenarios"]))
    print((out / "compare.md").read_text())
    print(f"wrote {out} in {meta['elapsed_s']:.0f} s")
    return result


def prepare_llamacpp(a, todo) -> dict | None:
    """Build llama.cpp if a planned scenario runs it; sets ``a.llamacpp`` to (server, gguf) or
    None. Returns what the metadata records (None when llama.cpp was not asked for)."""
    a.llamacpp = a.llamacpp_q8_0 = None
    if not any(s.startswith("llamacpp") for _, systems in todo for s in systems):
        return None
    reasons = []
    try:
        source = llamacpp_peer.source_gguf(a.model)
    except (ValueError, OSError, subprocess.CalledProcessError) as exc:
        print(f"llama.cpp skipped: {exc}", flush=True)
        return {"available": False, "reason": str(exc)}
    log = lambda m: (print(m, flush=True), reasons.append(m))  # noqa: E731
    a.llamacpp = llamacpp_peer.ensure_llamacpp(source_gguf=source, log=log)
    if a.llamacpp and any("llamacpp-q8_0" in systems for _, systems in todo):
        a.llamacpp_q8_0 = llamacpp_peer.q8_0_gguf(source, log=log)
    return {"available": a.llamacpp is not None, "version": f"llama-cpp-python {llamacpp_peer.LLAMA_CPP_PYTHON_VERSION}"
            " vendored llama.cpp", "reason": None if a.llamacpp else reasons[-1]}


def _write_scenario_plot(out: Path, scen: str, labels) -> None:
    """One CDF figure per scenario, every system as a line (from the per-run JSON files)."""
    from jaxinfer.bench.client import RequestResult

    series = []
    for system, label in labels:
        raw = json.loads((out / "runs" / f"{label}.json").read_text())["requests"]
        series.append((system, [RequestResult(**{k: v for k, v in r.items() if k != "tpot"}) for r in raw]))
    if series:
        report.plot_cdfs(out / f"{scen}_cdf.png", series)


if __name__ == "__main__":
    main()
