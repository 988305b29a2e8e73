"""Multi-host start-up and failures with two real ``server.py`` processes (issue 19).

Each process has 2 fake CPU devices and the tiny random model is tensor-parallel over all
4 (``--load-format dummy``), as in docs/distributed.md's one-machine command:

* the documented command with no KV size flag starts (each process plans its pool from
  its own devices; the processes agree on one block count) and serves; SIGKILL of the
  follower mid-stream then gives the client an error and ends the leader, non-zero, within
  10 s, with a log line naming the dead process;
* a start-up failure on the follower (a model that does not exist) ends both processes
  non-zero, the leader's log naming the follower's error;
* processes that plan different KV pools use the smallest; SIGKILL of the leader then ends
  the follower, non-zero, within 10 s;
* a step of the leader's engine that raises (the ``JAXINFER_FAIL_STEP`` hook, set on the
  leader only) gives the client its 500, ends the leader with status 1 within its fault
  policy's bound and the follower, non-zero, within 10 s, its log naming the failure.

The independent facts checked are the processes' exit statuses and wall-clock times, the
HTTP answers, and the logs' reasons. Timing of the failures: `jaxinfer.distributed.step_channel`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from api_helpers import free_port, wait_until
from helpers import tiny_config

from jaxinfer.entrypoints.openai import engine_death
from jaxinfer.engine.fault_injection import ENV_VAR as FAIL_STEP_VAR

ROOT = Path(__file__).resolve().parents[1]
EXIT_BOUND_S = 10.0  # a process must be gone this long after its peer died
START_TIMEOUT_S = 120.0


class Job:
    """Two ``server.py`` processes (leader 0, follower 1) of one multi-host run, logs under ``tmp``."""

    def __init__(self, tmp: Path, extra: list[str], per_process: dict[int, list[str]] | None = None,
                 env_per_process: dict[int, dict[str, str]] | None = None):
        cfg = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=4, inter=128)
        model = tmp / "tiny.json"
        model.write_text(json.dumps(cfg.to_hf_dict()))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs = [tmp / f"process{i}.log" for i in range(2)]
        env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
               "PYTHONUNBUFFERED": "1"}
        common = [sys.executable, str(ROOT / "server.py"), "--load-format", "dummy",
                  "--no-warmup", "--tensor-parallel-size", "4", "--max-model-len", "256", "--max-num-seqs", "2",
                  "--max-num-batched-tokens", "16", "--coordinator-address", f"127.0.0.1:{free_port()}",
                  "--num-processes", "2", "--port", str(self.port), *extra]
        self.procs = []
        for i in range(2):
            with open(self.logs[i], "w") as log:
                own = (per_process or {}).get(i, [])
                model_flag = [] if "--model" in own else ["--model", str(model)]
                self.procs.append(subprocess.Popen(common + ["--process-id", str(i)] + model_flag + own, cwd=ROOT,
                                                   env={**env, **(env_per_process or {}).get(i, {})}, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def log(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def tails(self) -> str:
        return "\n".join(f"--- process {i}:\n{self.log(i)[-3000:]}" for i in range(2))

    def wait_ready(self) -> None:
        def ready():
            assert all(p.poll() is None for p in self.procs), "a process exited during start-up\n" + self.tails()
            try:
                return httpx.get(self.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(ready, START_TIMEOUT_S, 0.5), "not ready\n" + self.tails()

    def exit_time(self, i: int, since: float, bound: float = EXIT_BOUND_S) -> tuple[int | None, float]:
        """(exit status, seconds from ``since``) of process ``i``; status None if it outlived ``bound``."""
        try:
            status = self.procs[i].wait(timeout=max(0.0, since + bound - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None, time.monotonic() - since
        return status, time.monotonic() - since

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)


@pytest.fixture
def job_factory(tmp_path):
    jobs = []

    def make(extra=(), per_process=None, env_per_process=None):
        jobs.append(Job(tmp_path, list(extra), per_process, env_per_process))
        return jobs[-1]

    yield make
    for j in jobs:
        j.kill_all()


@pytest.mark.slow
def test_documented_command_without_kv_size_serves_and_follower_kill_ends_leader(job_factory, smollm2_dir):
    # No --num-blocks, no --kv-cache-memory: the CPU default budget, planned per process. The
    # tokenizer is only there so that streamed tokens have text (an event per token).
    job = job_factory(["--tokenizer", str(smollm2_dir)])
    job.wait_ready()
    log = job.log(0)
    assert "kv_blocks=" in log
    body = {"prompt": [5, 6, 7], "temperature": 0, "ignore_eos": True}
    r = httpx.post(job.url + "/v1/completions", json={**body, "max_tokens": 4}, timeout=120)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text

    with httpx.stream("POST", job.url + "/v1/completions", json={**body, "max_tokens": 240, "stream": True},
                      timeout=60) as stream:
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "choices" in first  # tokens are flowing: kill the follower mid-stream
        job.procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        rest = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    status, seconds = job.exit_time(0, killed)
    assert status not in (None, 0), f"leader status {status} after {seconds:.1f} s\n" + job.tails()
    assert rest[-1] == "[DONE]" and "error" in json.loads(rest[-2]), rest[-3:]
    assert "process 1 is gone" in job.log(0), job.tails()


@pytest.mark.slow
def test_follower_start_up_failure_ends_both(job_factory, tmp_path):
    job = job_factory(["--num-blocks", "64"], per_process={1: ["--model", str(tmp_path / "no-such-model")]})
    started = time.monotonic()
    status1, _ = job.exit_time(1, started, START_TIMEOUT_S)
    assert status1 not in (None, 0), job.tails()
    follower_gone = time.monotonic()
    status0, seconds = job.exit_time(0, follower_gone)
    assert status0 not in (None, 0), f"leader status {status0} after {seconds:.1f} s\n" + job.tails()
    assert "process 1 failed" in job.log(0) and "no-such-model" in job.log(0), job.tails()


@pytest.mark.slow
def test_block_count_agreed_and_leader_death_ends_follower(job_factory):
    """The processes plan different pools (here by flag): both use the smaller one; then
    SIGKILL of the leader ends the follower."""
    job = job_factory(per_process={0: ["--num-blocks", "64"], 1: ["--num-blocks", "48"]})
    job.wait_ready()
    assert "kv_blocks=48 " in job.log(0) and "48 blocks (the smallest pool planned over the processes" in job.log(0)
    r = httpx.post(job.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0},
                   timeout=120)
    assert r.status_code == 200, r.text
    job.procs[0].send_signal(signal.SIGKILL)
    status, seconds = job.exit_time(1, time.monotonic())
    assert status not in (None, 0), f"follower status {status} after {seconds:.1f} s\n" + job.tails()
    assert "the leader (process 0) is gone" in job.log(1), job.tails()


@pytest.mark.slow
def test_leader_engine_death_ends_follower(job_factory):
    job = job_factory(["--num-blocks", "64"], env_per_process={0: {FAIL_STEP_VAR: "3"}})
    job.wait_ready()
    r = httpx.post(job.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0,
                                                       "ignore_eos": True}, timeout=120)
    died = time.monotonic()  # the 3rd step (after prefill and one decode) raised before the answer
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_dead", r.text
    status0, seconds0 = job.exit_time(0, died, engine_death.EXIT_BOUND_S + 2)
    assert status0 == engine_death.EXIT_STATUS, f"leader status {status0} after {seconds0:.1f} s\n" + job.tails()
    status1, seconds1 = job.exit_time(1, died)
    assert status1 not in (None, 0), f"follower status {status1} after {seconds1:.1f} s\n" + job.tails()
    follower = job.log(1)
    assert "the leader (process 0) failed" in follower and "injected failure of engine step 3" in follower, \
        job.tails()
    assert "process 1 failed" not in job.log(0), job.tails()  # the leader ended by its own fault policy
