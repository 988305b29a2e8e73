"""Multi-host serving with two real processes on 127.0.0.1 (jax.distributed, CPU, gloo).

Each process has 2 CPU devices; the model is tensor-parallel over all 4, so every step
runs collectives across the two processes. Process 0 serves greedy requests through
`LLM.generate`; process 1 follows the broadcast steps. The reference is the same
dummy-weight model on one device in this test process.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_config

from jaxinfer import LLM, SamplingParams
from jaxinfer.distributed.step_channel import recv_msg as _recv_msg, send_msg as _send_msg

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [200, 3, 99, 41, 17, 250, 8]]
MAX_TOKENS = 8
TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_wire_format_round_trip():
    a, b = socket.socketpair()
    arrays = {"x": np.arange(12, dtype=np.int32).reshape(3, 4), "flag": np.array(True), "f": np.ones(0, np.float32),
              "u": np.array([2**32 - 1], np.uint32)}
    _send_msg(a, {"kind": "step", "bucket": [8, 4, 0]}, arrays)
    _send_msg(a, {"kind": "stop"})
    header, got = _recv_msg(b)
    assert header == {"kind": "step", "bucket": [8, 4, 0]}
    assert got.keys() == arrays.keys()
    for k in arrays:
        assert got[k].dtype == arrays[k].dtype and got[k].shape == arrays[k].shape
        np.testing.assert_array_equal(got[k], arrays[k])
    assert _recv_msg(b)[0] == {"kind": "stop"}
    a.close()
    assert _recv_msg(b) is None  # leader gone: the follower's loop ends
    b.close()


def test_two_processes_serve_a_request_end_to_end(tmp_path):
    cfg = tiny_config(vocab=256, hidden=64, layers=2, heads=8, kv_heads=4, inter=128)
    config_path = tmp_path / "tiny.json"
    config_path.write_text(json.dumps(cfg.to_hf_dict()))
    port = free_port()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    procs, logs = [], []
    try:
        for i in range(2):
            log = open(tmp_path / f"worker{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), "--coordinator", f"127.0.0.1:{port}", "--process-id", str(i),
                 "--num-processes", "2", "--config", str(config_path), "--prompts", json.dumps(PROMPTS),
                 "--max-tokens", str(MAX_TOKENS), "--tensor-parallel-size", "4", "--out", str(tmp_path / f"{i}.json")],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))
        for p in procs:
            p.wait(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    tails = "\n".join((tmp_path / f"worker{i}.log").read_text()[-3000:] for i in range(2))
    assert [p.returncode for p in procs] == [0, 0], tails
    leader = json.loads((tmp_path / "0.json").read_text())
    follower = json.loads((tmp_path / "1.json").read_text())
    assert leader["process_count"] == follower["process_count"] == 2 and leader["device_count"] == 4
    assert follower["steps"] == leader["steps"] > 0  # the follower ran every step the leader ran
    # the KV cache is split over the 4 devices of both processes: 1 of 4 KV heads each, 2 local shards
    assert leader["kv_global_shape"] == [2, 32, 16, 4, 8]
    assert leader["kv_shard_shapes"] == [[2, 32, 16, 1, 8]] * 2

    ref = LLM(str(config_path), load_format="dummy", max_model_len=64, max_num_seqs=4, max_num_batched_tokens=32,
              num_blocks=32, warmup=False, return_logits=True, enable_prefix_caching=False)
    outs = ref.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
                        use_tqdm=False)
    assert leader["tokens"] == [o.outputs[0].token_ids for o in outs]
    for got, o in zip(leader["logits"], outs):
        assert np.abs(np.array(got, np.float32) - np.array(o.outputs[0].logits)).max() <= 1e-4


@pytest.mark.slow
@pytest.mark.real_model
def test_two_process_http_server_end_to_end(smollm2_dir, oracle):
    """`python server.py --coordinator-address ... --num-processes 2 --process-id I`: process 0
    serves HTTP, both run the TP-2 steps; greedy output equals the oracle; SIGTERM ends both."""
    import signal
    import time

    import httpx

    coord, http = free_port(), free_port()
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=1", "PYTHONUNBUFFERED": "1"}
    common = [sys.executable, str(ROOT / "server.py"), "--model", str(smollm2_dir), "--no-warmup",
              "--tensor-parallel-size", "2", "--max-model-len", "128", "--max-num-seqs", "4",
              "--max-num-batched-tokens", "32", "--num-blocks", "64", "--coordinator-address", f"127.0.0.1:{coord}",
              "--num-processes", "2", "--port", str(http)]
    procs = [subprocess.Popen(common + ["--process-id", str(i)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT) for i in (0, 1)]
    try:
        deadline = time.monotonic() + TIMEOUT_S
        url = f"http://127.0.0.1:{http}"
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert all(p.poll() is None for p in procs), "a server process exited during start-up"
            time.sleep(0.5)
        rec = oracle["results"][0]
        r = httpx.post(url + "/v1/completions", timeout=120,
                       json={"model": str(smollm2_dir), "prompt": rec["prompt_ids"], "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == rec["generated_text"][:len(r.json()["choices"][0]["text"])]
        assert len(r.json()["choices"][0]["text"]) > 0
        procs[0].send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            out = p.communicate(timeout=10)[0].decode(errors="replace") if p.stdout else ""
            if p.returncode not in (0, None):
                print(out[-3000:])
