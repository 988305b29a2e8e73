"""The narrower recovery of the engine fault policy (docs/api.md, "Engine faults"; issue 19):
a step whose host-side preparation raises fails only its own requests, and the engine goes on.

Checked against independent references: on a tiny random Llama, the requests outside the
failed step, and new requests with the failed ones' prompts (prefix cache on, so that a
block registered before its KV was written would be reused), give the same greedy tokens
as a fresh engine that never failed, and every KV block comes back. A real server process
(tests/fake_server.py) with ``JAXINFER_FAIL_PHASE=prepare`` answers the step's clients with
500 ``step_failed`` (or an SSE error event then ``[DONE]``), the others normally, and keeps
serving with ``/live`` and ``/health`` at 200. Failures in a row end the engine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from api_helpers import REPO, assert_error, fake_engine, free_port, sse_events, wait_until
from helpers import borrowed_runner, http_healthy, post_completions_at_once, run_until_idle, tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.llm_engine import MAX_FAILED_PREPARES
from jaxinfer.engine.fault_injection import ENV_VAR, PHASE_ENV_VAR, PREPARE, STEP, InjectedStepFault, StepFault
from jaxinfer.models.params import init_params

CFG = tiny_config(vocab=256, tied=False)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_the_phase_variable_picks_where_the_hook_raises():
    env = {ENV_VAR: "2,3", PHASE_ENV_VAR: "prepare"}
    step, prepare = StepFault.from_env(env, STEP), StepFault.from_env(env, PREPARE)
    for _ in range(5):
        step.before_step()  # the step phase is not the one named: never raises
    prepare.before_step()
    for n in (2, 3):
        with pytest.raises(InjectedStepFault, match=f"preparation of engine step {n}"):
            prepare.before_step()
    prepare.before_step()
    with pytest.raises(ValueError, match=PHASE_ENV_VAR):
        StepFault.from_env({ENV_VAR: "1", PHASE_ENV_VAR: "device"})
    with pytest.raises(ValueError, match=ENV_VAR):
        StepFault.from_env({ENV_VAR: "1,x", PHASE_ENV_VAR: "prepare"}, PREPARE)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, num_blocks=96, model_config=CFG,
               params=init_params(CFG, scale=5.0, seed=1), tokenizer=None)


def _prompts():
    rs = np.random.RandomState(7)
    return {name: rs.randint(3, CFG.vocab_size, n).tolist() for name, n in (("a", 100), ("b", 100), ("e", 20))}


def test_failed_prepare_fails_its_step_alone_and_leaves_no_bad_block(llm):
    prompts = _prompts()
    with borrowed_runner(llm.engine) as ref:
        for name, p in prompts.items():
            ref.add_request(name, p, GREEDY)
        want = {rid: out.outputs[0].token_ids for rid, out in run_until_idle(ref).items()}
    with borrowed_runner(llm.engine) as e:
        e.prepare_fault = StepFault(2, PREPARE)
        for name, p in prompts.items():  # 64 tokens a step: a is prefilled over 2 steps, e waits behind b
            e.add_request(name, p, GREEDY)
        done = {o.request_id: o for o in e.step() if o.finished}
        assert not done and e.scheduler.prefix_hits == 0
        done = {o.request_id: o for o in e.step() if o.finished}  # its preparation raises
        assert "a" in done and "e" not in done, done
        assert all(o.outputs[0].finish_reason == "failed" and not o.outputs[0].token_ids for o in done.values())
        assert e.stats.failed_steps == 1 and e.num_steps == 1
        e.add_request("a-again", prompts["a"], GREEDY)
        e.add_request("b-again", prompts["b"], GREEDY)
        rest = run_until_idle(e)
        assert e.num_free_blocks == e.num_total_blocks and not e.requests  # the failed step's blocks came back
    assert rest["e"].outputs[0].token_ids == want["e"]  # outside the step: as if nothing happened
    assert rest["a-again"].outputs[0].token_ids == want["a"]
    assert rest["b-again"].outputs[0].token_ids == want["b"]
    # a's first 64 tokens (4 blocks) were computed in step 1 and are reused; nothing of step 2 is
    assert rest["a-again"].num_cached_tokens == 64


def test_failed_prepares_in_a_row_kill_the_engine():
    e = fake_engine()
    e.prepare_fault = StepFault([1, 2, 4, 5], PREPARE)  # a success in between resets the count
    for i in range(5):
        e.add_request(f"r{i}", [100 + i], SamplingParams(max_tokens=4, ignore_eos=True))
        e.step()
    assert e.stats.failed_steps == 4 and e.num_steps == 1
    e = fake_engine()
    e.prepare_fault = StepFault(range(1, MAX_FAILED_PREPARES + 1), PREPARE)
    for i in range(MAX_FAILED_PREPARES - 1):
        e.add_request(f"r{i}", [100 + i], SamplingParams(max_tokens=4))
        e.step()
    e.add_request("last", [7], SamplingParams(max_tokens=4))
    with pytest.raises(RuntimeError, match=f"{MAX_FAILED_PREPARES} times in a row") as dead:
        e.step()
    assert isinstance(dead.value.__cause__, InjectedStepFault)


FAIL_AT = 20  # 10 ms steps: the first 8 clients are running, the last 4 waiting


def test_server_answers_the_failed_step_and_keeps_serving():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, **{ENV_VAR: str(FAIL_AT), PHASE_ENV_VAR: PREPARE})
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(port), "30"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: http_healthy(url), 60, 0.1), "no health"
        results, clients = post_completions_at_once(url, 12, max_tokens=100, join_s=30)
        assert not any(t.is_alive() for t in clients), "a client was left hanging"
        failed = ok = 0
        for i, r in sorted(results.items()):
            assert isinstance(r, httpx.Response), (i, r)
            if r.status_code != 200:
                assert assert_error(r, 500, type_="server_error")["code"] == "step_failed"
                failed += 1
                continue
            if i % 2:
                events = sse_events(r.content)
                assert events[-1] == "[DONE]", events[-3:]
                last = json.loads(events[-2])
                if "error" in last:  # a stream under way when its step failed
                    assert last["error"]["code"] == "step_failed", last
                    failed += 1
                    continue
            else:
                assert r.json()["usage"]["completion_tokens"] == 100, r.text
            ok += 1
        assert failed >= 1 and ok >= 1, (failed, ok)
        assert proc.poll() is None  # still serving
        assert httpx.get(url + "/live").status_code == 200 and httpx.get(url + "/health").status_code == 200
        r = httpx.post(url + "/v1/completions", json={"prompt": [5], "max_tokens": 3, "ignore_eos": True}, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
        metrics = httpx.get(url + "/metrics").text
        counted = [line for line in metrics.splitlines()
                   if line.startswith("jaxinfer_request_success_total") and 'finished_reason="failed"' in line]
        assert counted and float(counted[0].split()[-1]) == failed, counted
    finally:
        proc.kill()
        log = proc.communicate(timeout=10)[0].decode(errors="replace")
    assert f"injected failure of preparation of engine step {FAIL_AT}" in log and "serving goes on" in log, log[-3000:]
