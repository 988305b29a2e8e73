"""The engine fault policy (docs/api.md, issue 19): a step that raises ends the process.

A real server process (`server.serve` over a fake-runner engine, tests/fake_server.py)
with the ``JAXINFER_FAIL_STEP`` test hook: every client in flight or queued, streaming or
not, gets a clean error (500 envelope, or an error event then ``[DONE]``) and none hangs;
``/live`` and ``/health`` turn 503; the process exits with status 1 within the bound.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from api_helpers import REPO, assert_error, free_port, sse_events, wait_until
from jaxinfer.api import engine_death
from jaxinfer.fault_injection import ENV_VAR, InjectedStepFault, StepFault

FAIL_STEP = 60  # 10 ms steps: about 0.6 s into the workload, with every request admitted or queued


def test_step_fault_counts_steps_and_reads_env():
    fault = StepFault.from_env({ENV_VAR: "3"})
    fault.before_step()
    fault.before_step()
    with pytest.raises(InjectedStepFault, match="step 3"):
        fault.before_step()
    fault.before_step()  # only the Nth step fails
    StepFault.from_env({}).before_step()  # unset: never
    for bad in ("0", "x", "-2"):
        with pytest.raises(ValueError, match=ENV_VAR):
            StepFault.from_env({ENV_VAR: bad})


def _start_server(port: int) -> subprocess.Popen:
    env = dict(os.environ, **{ENV_VAR: str(FAIL_STEP)})
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(port), "30"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _poll_probes(url: str, seen: dict, stop: threading.Event) -> None:
    """Record every status /live and /health answer (None: refused) until ``stop``."""
    with httpx.Client(base_url=url, timeout=2) as http:
        while not stop.is_set():
            for path in ("/live", "/health"):
                try:
                    seen[path].add(http.get(path).status_code)
                except httpx.HTTPError:
                    seen[path].add(None)
            time.sleep(0.02)


def test_injected_step_failure_fails_every_client_and_exits_nonzero():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_server(port)
    try:
        def healthy():
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(healthy, 60, 0.1), proc.stdout.read1().decode() if proc.poll() is not None else "no health"
        seen = {"/live": set(), "/health": set()}
        stop = threading.Event()
        poller = threading.Thread(target=_poll_probes, args=(url, seen, stop), daemon=True)
        poller.start()
        results: dict[int, httpx.Response | BaseException] = {}

        def call(i: int) -> None:  # 12 clients: 8 run (max_num_seqs) and 4 wait in the queue
            body = {"prompt": [1000 + i], "max_tokens": 1000, "ignore_eos": True, "stream": i % 2 == 1}
            try:
                with httpx.Client(timeout=30) as c:
                    results[i] = c.post(url + "/v1/completions", json=body)
            except BaseException as exc:  # noqa: BLE001 - recorded and asserted on below
                results[i] = exc

        clients = [threading.Thread(target=call, args=(i,)) for i in range(12)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(20)
        answered = time.monotonic()
        assert not any(t.is_alive() for t in clients), "a client was left hanging"
        for i, r in sorted(results.items()):
            assert isinstance(r, httpx.Response), (i, r)
            if r.status_code == 200:  # a stream that had started: an error event, then [DONE]
                events = sse_events(r.content)
                assert events[-1] == "[DONE]", events[-3:]
                err = json.loads(events[-2])["error"]
                assert err["code"] == "engine_dead" and err["type"] == "server_error", err
            else:  # failed before its first token (queued stream, or not streaming): 500 envelope
                assert assert_error(r, 500, type_="server_error")["code"] == "engine_dead"
        assert any(r.status_code == 200 for r in results.values())  # some streams had started
        rc = proc.wait(engine_death.EXIT_BOUND_S + 3)
        exited = time.monotonic()
        stop.set()
        poller.join(5)
        assert rc == engine_death.EXIT_STATUS
        assert exited - answered <= engine_death.EXIT_BOUND_S + 1.0
        assert 503 in seen["/live"] and 503 in seen["/health"], seen
        log = proc.stdout.read().decode(errors="replace")
        assert f"injected failure of engine step {FAIL_STEP}" in log and "exiting with status 1" in log, log[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
