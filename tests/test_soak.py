"""The soak benchmark (benchmarks/soak.py, issue 19): its acceptance checks on made-up runs
whose verdict is known by construction, and a half-minute smoke run against a real server
process (tests/fake_server.py: `server.serve` over a fake-runner engine, no compiling)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from api_helpers import REPO, free_port, wait_until
from helpers import http_healthy

sys.path.insert(0, str(REPO / "benchmarks"))

import soak  # noqa: E402
import soak_report  # noqa: E402


CYCLE_S, LOAD_S = 100.0, 80.0  # made-up cycles: 80 s of load, then a 20 s idle gap


def sawtooth(offset_s: float) -> float:
    """A cycle's TTFT (s) by send time: short, then long after the burst halfway (the queue fills)."""
    return 1.0 if offset_s < LOAD_S / 2 else 1.0 + 30.0 * (offset_s - LOAD_S / 2) / (LOAD_S / 2)


def cycle_requests(cycle: int, scale: float, noise: np.random.Generator | None = None) -> list[dict]:
    """One cycle's successful streamed requests, one every 2 s of its load phase, TTFT
    `sawtooth` x ``scale`` (x a few percent of noise when ``noise`` is given)."""
    out = []
    for off in np.arange(0.0, LOAD_S, 2.0):
        t = cycle * CYCLE_S + off
        ttft = sawtooth(off) * scale * (1.0 if noise is None else float(noise.uniform(0.95, 1.05)))
        out.append({"t": float(t), "outcome": "ok", "status": 200, "t_first_token": float(t) + ttft, "ttft_s": ttft})
    return out


def run(rss_growth=0.0, kv_at_gaps=None, fds=None, threads=None, creep_per_cycle=0.0, outcomes=("ok",), seed=0):
    """A 20-minute run (warm 5) of 12 cycles whose samples, gap checks and requests are made
    up; ``creep_per_cycle``: each cycle's TTFTs are that fraction slower than the previous'."""
    warm, cycles = 300.0, 12
    end = cycles * CYCLE_S
    samples = [{"t": t, "rss_bytes": 1e9 * (1 + rss_growth * max(0.0, t - warm) / (end - warm))}
               for t in range(0, int(end) + 1, 10)]
    kv_at_gaps = kv_at_gaps or [100] * cycles
    fds, threads = fds or [20] * cycles, threads or [30] * cycles
    gaps = [{"t": (i + 1) * CYCLE_S, "kv_free": kv_at_gaps[i], "fds": fds[i], "threads": threads[i]}
            for i in range(cycles)]
    noise = np.random.default_rng(seed)
    requests = [r for c in range(cycles) for r in cycle_requests(c, 1.0 + creep_per_cycle * c, noise)]
    requests += [{"t": 5.0, "outcome": o, "status": 500, "t_first_token": None, "ttft_s": None}
                 for o in outcomes if o != "ok"]
    return soak_report.evaluate(samples, gaps, requests, idle_kv_free=100, warm_s=warm, end_s=end)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_steady_run_passes(seed):
    verdict = run(rss_growth=0.02, outcomes=("ok", "rate_limited", "client_abort", "timeout_expected"), seed=seed)
    assert verdict["all_pass"], verdict["checks"]
    ttft = verdict["checks"]["ttft_p99_stable"]
    assert ttft["cycles_per_window"] == 3 and ttft["first_cycles"][0] == (300.0, 400.0)


@pytest.mark.parametrize("kwargs,failing", [
    ({"rss_growth": 0.08}, "rss_growth"),
    ({"kv_at_gaps": [100] * 11 + [97]}, "kv_free_returns"),
    ({"fds": [20] * 6 + [40] * 6}, "fds_flat"),
    ({"threads": [30] * 6 + [40] * 6}, "threads_flat"),
    ({"creep_per_cycle": 0.05}, "ttft_p99_stable"),  # the last 3 cycles ~1.25x the first 3 after warm-up
    ({"outcomes": ("server_error",)}, "no_unexpected_5xx"),
    ({"outcomes": ("unanswered",)}, "every_request_answered"),
])
def test_each_degradation_fails_its_check(kwargs, failing):
    verdict = run(**kwargs)
    assert not verdict["all_pass"]
    assert [name for name, c in verdict["checks"].items() if not c["pass"]] == [failing]


def test_ttft_windows_hold_whole_cycles_only():
    """A cycle that straddles the end of warm-up (its post-warm-up half slow, as a cold
    start) is left out, and a clock cut through cycles would not compare like with like:
    the windows are the first and last whole cycles after warm-up, as many in each."""
    warm = 250.0  # cycle 2 (200-300 s) straddles it
    requests = [r for c in range(12) for r in cycle_requests(c, 3.0 if c == 2 else 1.0)]
    gaps = [{"t": (i + 1) * CYCLE_S} for i in range(12)]
    check = soak_report.ttft_stable(requests, gaps, warm_s=warm, end_s=12 * CYCLE_S)
    assert check["pass"] and check["first_cycles"][0][0] == 300.0, check
    assert check["ratio"] == pytest.approx(1.0)
    assert len(check["first_cycles"]) == len(check["last_cycles"]) == check["cycles_per_window"]
    # a window cut by the clock from the end of warm-up holds the slow cycle's tail
    early = [r["ttft_s"] for r in requests if warm <= r["t_first_token"] < warm + 300]
    assert soak_report.percentile(early, 99) > 1.2 * check["first_p99_s"]


def test_too_short_a_run_says_why():
    requests = cycle_requests(0, 1.0) + cycle_requests(1, 1.0)
    check = soak_report.ttft_stable(requests, [{"t": 100.0}, {"t": 200.0}], warm_s=50.0, end_s=200.0)
    assert not check["pass"] and "whole cycle" in check["reason"]


def test_every_cycle_replays_the_same_load_phase():
    a = soak.parse_args(["--cycle-s", "30", "--idle-s", "10", "--rate", "2", "--burst", "5", "--seed", "3"])
    first, again = soak.cycle_pattern(a), soak.cycle_pattern(a)
    assert first == again
    bodies = [soak.request_body(s.spec, np.random.default_rng(s.body_seed), a) for s in first]
    assert bodies == [soak.request_body(s.spec, np.random.default_rng(s.body_seed), a) for s in again]
    offsets = [s.offset_s for s in first]
    assert offsets == sorted(offsets) and 0.0 <= offsets[0] and offsets[-1] < 20.0
    assert [s.offset_s for s in first if s.spec.burst] == [10.0] * 5
    assert len({s.body_seed for s in first}) == len(first)  # distinct prompts within a cycle
    other = soak.cycle_pattern(soak.parse_args(["--cycle-s", "30", "--idle-s", "10", "--rate", "2", "--seed", "4"]))
    assert [s.offset_s for s in other] != offsets


@pytest.mark.slow
def test_half_minute_smoke_against_a_server(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(port), "5"], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: http_healthy(url), 60, 0.1)
        # the fake engine queues 64 requests: a burst of 72 overflows it
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "soak.py"), "--url", url, "--server-pid",
                               str(server.pid), "--minutes", "0.5", "--warm-minutes", "0.1", "--cycle-s", "12",
                               "--idle-s", "3", "--sample-s", "1", "--rate", "3", "--burst", "72", "--max-tokens", "8", "64",
                               "--out",
                               str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=240)
    finally:
        server.terminate()
        server.wait(30)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    checks, exercised = doc["acceptance"]["checks"], doc["acceptance"]["exercised"]
    for name in ("kv_free_returns", "no_unexpected_5xx", "every_request_answered", "fds_flat"):
        assert checks[name]["pass"], (name, checks[name])
    # Threads with a smoke's slack: pools that grow on demand (asyncio's default executor, where
    # prompts are tokenized, up to min(32, cores + 4) threads; the HTTP layer's worker threads)
    # may still be growing to meet the 72-request burst in 30 s on a busy machine (seen: 23, 27,
    # 28 against the soak's tolerance of 4). A per-request leak adds ~72 per cycle.
    threads = checks["threads_flat"]["values"]
    assert len(threads) >= 2 and max(threads) - threads[0] <= 16, threads
    assert proc.returncode == (0 if doc["acceptance"]["all_pass"] else 1)
    assert exercised["rate_limited"] > 0 and exercised["client_abort"] > 0 and exercised["timeout_expected"] > 0
    assert exercised["n2_requests"] > 0 and exercised["prefix_cache_hits"] > 0
    assert len(doc["idle_checks"]) >= 2 and len(doc["samples"]) >= 20
    assert all(s["rss_bytes"] > 0 and s["fds"] > 0 and s["kv_free"] is not None for s in doc["samples"])
    # what the client saw agrees with the server's own counters
    last = doc["samples"][-1]["metrics"]
    assert last['jaxinfer_requests_rejected_total{reason="queue_full"}'] == exercised["rate_limited"]
