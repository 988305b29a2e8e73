"""The soak benchmark (benchmarks/soak.py, issue 19): its acceptance checks on made-up runs
whose verdict is known by construction, and a half-minute smoke run against a real server
process (tests/fake_server.py: `server.serve` over a fake-runner engine, no compiling)."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from api_helpers import REPO, free_port, wait_until

sys.path.insert(0, str(REPO / "benchmarks"))

import soak_report  # noqa: E402


def run(rss_growth=0.0, kv_at_gaps=(100, 100), fds=(20, 21), threads=(30, 30), ttft_late=1.0, outcomes=("ok",)):
    """A 20-minute run (warm 5) whose samples, gap checks and requests are made up."""
    warm, end = 300.0, 1200.0
    samples = [{"t": t, "rss_bytes": 1e9 * (1 + rss_growth * max(0.0, t - warm) / (end - warm))}
               for t in range(0, 1201, 10)]
    gaps = [{"t": 400.0 + 400 * i, "kv_free": kv, "fds": f, "threads": th}
            for i, (kv, f, th) in enumerate(zip(kv_at_gaps, fds, threads))]
    requests = []
    for t in range(310, 1200, 2):  # TTFT 1 s early; ttft_late in the last 5 minutes
        requests.append({"outcome": "ok", "status": 200, "t_first_token": float(t),
                         "ttft_s": ttft_late if t >= end - 300 else 1.0})
    requests += [{"outcome": o, "status": 500, "t_first_token": None, "ttft_s": None} for o in outcomes if o != "ok"]
    return soak_report.evaluate(samples, gaps, requests, idle_kv_free=100, warm_s=warm, end_s=end)


def test_a_steady_run_passes():
    verdict = run(rss_growth=0.02, ttft_late=1.1, outcomes=("ok", "rate_limited", "client_abort", "timeout_expected"))
    assert verdict["all_pass"], verdict["checks"]


@pytest.mark.parametrize("kwargs,failing", [
    ({"rss_growth": 0.08}, "rss_growth"),
    ({"kv_at_gaps": (100, 97)}, "kv_free_returns"),
    ({"fds": (20, 40)}, "fds_flat"),
    ({"threads": (30, 40)}, "threads_flat"),
    ({"ttft_late": 1.3}, "ttft_p99_stable"),
    ({"outcomes": ("server_error",)}, "no_unexpected_5xx"),
    ({"outcomes": ("unanswered",)}, "every_request_answered"),
])
def test_each_degradation_fails_its_check(kwargs, failing):
    verdict = run(**kwargs)
    assert not verdict["all_pass"]
    assert [name for name, c in verdict["checks"].items() if not c["pass"]] == [failing]


@pytest.mark.slow
def test_half_minute_smoke_against_a_server(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(port), "5"], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def healthy():
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(healthy, 60, 0.1)
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
    for name in ("kv_free_returns", "no_unexpected_5xx", "every_request_answered", "fds_flat", "threads_flat"):
        assert checks[name]["pass"], (name, checks[name])
    assert proc.returncode == (0 if doc["acceptance"]["all_pass"] else 1)
    assert exercised["rate_limited"] > 0 and exercised["client_abort"] > 0 and exercised["timeout_expected"] > 0
    assert exercised["n2_requests"] > 0 and exercised["prefix_cache_hits"] > 0
    assert len(doc["idle_checks"]) >= 2 and len(doc["samples"]) >= 20
    assert all(s["rss_bytes"] > 0 and s["fds"] > 0 and s["kv_free"] is not None for s in doc["samples"])
    # what the client saw agrees with the server's own counters
    last = doc["samples"][-1]["metrics"]
    assert last['jaxinfer_requests_rejected_total{reason="queue_full"}'] == exercised["rate_limited"]
