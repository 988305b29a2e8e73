"""Readiness, engine death and SIGTERM drain (SC-25, issue 3's lifecycle rules).

* Warm-up: ``/live`` is 200 while the engine builds; ``/health`` and POSTs are 503 with
  Retry-After (no hang); the first POST after ready compiles nothing new.
* Death: an engine step that raises turns ``/health`` and ``/live`` non-200 within 1 s;
  requests in flight get a 500 envelope or an error event, never a hang; new ones 503
  (the process exit is tests/test_engine_fault.py's).
* SIGTERM: in-flight streams finish, new requests (on new connections too) get 503 +
  Retry-After while the drain lasts, in a single engine and with data-parallel replicas;
  exit status 0.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from api_helpers import (REPO, LiveServer, assert_error, expected_ids, fake_engine, free_port, parse_metrics,
                         server_config, sse_events, tokenizer, wait_until)
from fakes import FakeRunner
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.engine.async_engine import AsyncEngine


def test_sc25_readiness_follows_warmup():
    release = threading.Event()
    engine = fake_engine()

    def build():
        release.wait(30)  # "loading weights and compiling"
        engine.warmup()
        return engine

    ae = AsyncEngine(build)
    with LiveServer(create_app(ae, server_config())) as live, httpx.Client(base_url=live.url, timeout=5) as http:
        for _ in range(5):  # poll every 100 ms while warming up
            assert http.get("/live").status_code == 200
            r = http.get("/health")
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            t0 = time.monotonic()
            r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
            assert assert_error(r, 503, type_="service_unavailable")["code"] == "not_ready"
            assert int(r.headers["retry-after"]) >= 1 and time.monotonic() - t0 < 1.0
            time.sleep(0.1)
        assert parse_metrics(http.get("/metrics").text)["jaxinfer_engine_healthy"] == 0
        release.set()
        assert wait_until(lambda: http.get("/health").status_code == 200, 5, 0.1)
        compilations = parse_metrics(http.get("/metrics").text)["jaxinfer_compilations_total"]
        assert compilations > 0
        r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
        assert r.status_code == 200
        assert parse_metrics(http.get("/metrics").text)["jaxinfer_compilations_total"] == compilations
        assert parse_metrics(http.get("/metrics").text)['jaxinfer_requests_rejected_total{reason="not_ready"}'] == 5


class CrashingRunner(FakeRunner):
    """A fake runner that raises once ``crash`` is set (the engine loop's test hook)."""

    crash = False

    def execute(self, inputs):
        if self.crash:
            raise RuntimeError("device lost (test)")
        return super().execute(inputs)


def test_sc25_engine_death_turns_health_red_and_fails_requests():
    runner = CrashingRunner(49152, step_delay=0.005)
    ae = AsyncEngine(fake_engine(runner=runner, max_model_len=1024))
    with LiveServer(create_app(ae, server_config())) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        assert http.get("/health").status_code == 200
        results = {}

        def non_stream():
            results["plain"] = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 900, "ignore_eos": True})

        def stream():
            results["stream"] = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 900,
                                                                   "ignore_eos": True, "stream": True})

        threads = [threading.Thread(target=f) for f in (non_stream, stream)]
        for t in threads:
            t.start()
        assert wait_until(lambda: parse_metrics(http.get("/metrics").text)["jaxinfer_num_requests_running"] == 2, 3)
        runner.crash = True
        t0 = time.monotonic()
        assert wait_until(lambda: http.get("/health").status_code != 200, 1.0)
        assert time.monotonic() - t0 < 1.0
        for t in threads:
            t.join(5)
            assert not t.is_alive()  # no hang
        assert assert_error(results["plain"], 500, type_="server_error")["code"] == "engine_dead"
        events = sse_events(results["stream"].content)
        assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
        assert_error(http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1}), 503)
        assert parse_metrics(http.get("/metrics").text)["jaxinfer_engine_healthy"] == 0
        assert_error(http.get("/live"), 503)


def start_fake_server(grace_s: float = 10.0, replicas: int = 1):
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fake_server.py"), str(port), str(grace_s),
                             str(replicas)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return proc, port


@pytest.fixture
def fake_server_process(request):
    grace_s, replicas = getattr(request, "param", (10.0, 1))
    proc, port = start_fake_server(grace_s, replicas)
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy():
            try:
                return httpx.get(url + "/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        assert wait_until(healthy, 60, 0.1), proc.stdout.read1().decode() if proc.poll() is not None else "no health"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.parametrize("fake_server_process,stop_signal", [((10.0, 1), signal.SIGTERM), ((10.0, 2), signal.SIGTERM),
                                                            ((10.0, 1), signal.SIGINT)],
                         indirect=["fake_server_process"], ids=["one-engine", "dp2", "one-engine-ctrl-c"])
def test_sigterm_drains_in_flight_streams(fake_server_process, stop_signal):
    """SIGTERM, or SIGINT (Ctrl+C): the stream finishes, new work gets 503, exit status 0, no traceback."""
    proc, url = fake_server_process
    result = {}

    def stream():
        with httpx.Client(timeout=30) as c:
            result["r"] = c.post(url + "/v1/completions", json={"prompt": [1000], "max_tokens": 100, "stream": True,
                                                                "ignore_eos": True})

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)  # the stream is under way (100 steps of 10 ms)
    proc.send_signal(stop_signal)
    time.sleep(0.3)
    # new work is refused with 503 + Retry-After on a new connection: the listener stays open while draining
    r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=2)
    assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, r.text
    assert r.json()["error"]["code"] == "draining", r.text  # as /health says, not "not_ready"
    assert httpx.get(url + "/health", timeout=2).status_code == 503
    t.join(20)
    events = sse_events(result["r"].content)
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text == tokenizer().decode(expected_ids([1000], 100))  # finished in full during the drain
    assert proc.wait(15) == 0
    log = proc.stdout.read().decode(errors="replace")
    assert "draining 1 requests (shutdown timeout 10 s)" in log and "drained: 1 finished" in log, log[-2000:]
    assert "Traceback" not in log, log[-2000:]


@pytest.mark.parametrize("fake_server_process", [(2.0, 1)], indirect=True)
def test_sigterm_past_grace_period_answers_503_and_error_events(fake_server_process):
    """Requests still running when the grace period ends get a 503 envelope (non-streaming)
    or an error event then [DONE] (streaming), never a bare 500 or a cut connection."""
    proc, url = fake_server_process
    body = {"prompt": [1000], "max_tokens": 1500, "ignore_eos": True}  # 15 s of 10 ms steps
    result = {}

    def call(key, stream):
        with httpx.Client(timeout=30) as c:
            result[key] = c.post(url + "/v1/completions", json={**body, "stream": stream})

    threads = [threading.Thread(target=call, args=(k, k == "stream")) for k in ("stream", "plain")]
    for t in threads:
        t.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(25)
    plain = result["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "aborted", plain.text
    events = sse_events(result["stream"].content)
    assert events[-1] == "[DONE]" and "error" in json.loads(events[-2])
    assert proc.wait(15) == 0
    log = proc.stdout.read().decode(errors="replace")
    assert "Traceback" not in log and "CancelledError" not in log, log[-2000:]
    assert "draining 2 requests (shutdown timeout 2 s)" in log, log[-2000:]
    assert "shutdown timeout: 2 aborted, 0 finished" in log, log[-2000:]
