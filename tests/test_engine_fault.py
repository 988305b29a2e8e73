"""The engine fault policy (docs/api.md, issue 19): a step that raises ends the process.

A real server process (`server.serve` over a fake-runner engine, tests/fake_server.py)
with the ``JAXINFER_FAIL_STEP`` test hook: every client in flight or queued, streaming or
not, gets a clean error (500 envelope, or an error event then ``[DONE]``) and none hangs;
``/live`` and ``/health`` turn 503; the process exits with status 1 within the bound.
With several models, the others' requests are aborted and a server that does not stop is
ended at the bound (`ExitOnEngineDeath` in process, its hard exit replaced).
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import types

import httpx
import pytest

from api_helpers import REPO, V, assert_error, fake_engine, free_port, sse_events, wait_until
from fakes import FakeRunner
from helpers import http_healthy
from jaxinfer.entrypoints.openai import engine_death
from jaxinfer.entrypoints.openai.model_registry import ModelRegistry, ServedModel
from jaxinfer.engine.async_engine import AsyncEngine, EngineDeadError, RequestSpec
from jaxinfer.engine.fault_injection import ENV_VAR, InjectedStepFault, StepFault
from jaxinfer.sampling_params import SamplingParams

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
        assert wait_until(lambda: http_healthy(url), 60, 0.1), proc.stdout.read1().decode() if proc.poll() is not None else "no health"
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


class CrashingRunner(FakeRunner):
    """Raises from ``execute`` once ``crash`` is set (a device error mid-serving)."""

    crash = False

    def execute(self, inputs):
        if self.crash:
            raise RuntimeError("device lost (test)")
        return super().execute(inputs)


def test_one_dead_model_stops_the_server_and_aborts_the_others(monkeypatch):
    """Two models: the healthy one's request is aborted (its client is answered), the server
    is told to stop after the linger, and a server that does not stop is ended at the bound."""
    monkeypatch.setattr(engine_death, "LINGER_S", 0.2)
    monkeypatch.setattr(engine_death, "EXIT_BOUND_S", 0.6)
    runner = CrashingRunner(V, step_delay=0.005)
    models = ModelRegistry([ServedModel("a", AsyncEngine(fake_engine(runner=runner, max_model_len=1024))),
                            ServedModel("b", AsyncEngine(fake_engine(max_model_len=1024, step_delay=0.005)))])
    server = types.SimpleNamespace(should_exit=False)  # what ExitOnEngineDeath drives of a uvicorn.Server
    exits: list[tuple[int, float]] = []
    death = engine_death.ExitOnEngineDeath(models, server, hard_exit=lambda status: exits.append(
        (status, time.monotonic())))
    models.start()
    assert models.wait_ready()
    spec = lambda rid: RequestSpec(rid, [100], SamplingParams(max_tokens=900, ignore_eos=True))  # noqa: E731

    async def run():
        a = await models.get("a").async_engine.add([spec("a-0")])
        b = await models.get("b").async_engine.add([spec("b-0")])
        await a.next_batch()
        runner.crash = True
        crashed = time.monotonic()
        with pytest.raises(EngineDeadError) as dead:
            while True:
                await a.next_batch()
        last = None
        while not b.finished:
            for out in await b.next_batch():
                last = out
        return crashed, dead.value, last

    try:
        crashed, dead, last = asyncio.run(run())
        assert dead.in_flight and death.died and "device lost" in death.error
        assert last.finished and last.outputs[0].finish_reason == "abort"  # the other model's client is answered
        assert len(last.outputs[0].token_ids) < 900
        assert [m.name for m in models.dead()] == ["a"]
        assert wait_until(lambda: server.should_exit, 2.0)
        assert wait_until(lambda: bool(exits), 3.0)  # nobody stopped the process: the bound does
        status, at = exits[0]
        assert status == engine_death.EXIT_STATUS and at - crashed <= engine_death.EXIT_BOUND_S + 0.5
    finally:
        models.shutdown()
