"""Clients that leave: aborts within an engine step, nothing leaks, queued requests never run (SC-14/15/17).

A real uvicorn server on 127.0.0.1 in a thread, over a fake-runner engine with a step
delay; sockets are closed from the client side (httpx timeouts or raw sockets).
"""
from __future__ import annotations

import asyncio
import logging
import random
import statistics
import threading
import time
from types import SimpleNamespace

import httpx
import psutil
import pytest

from api_helpers import (LiveServer, expected_ids, fake_engine, parse_metrics, raw_sse_request, running_app,
                         send_raw_request, tokenizer, wait_until)


def metrics(http) -> dict[str, float]:
    return parse_metrics(http.get("/metrics").text)


def idle(http, f0: float) -> bool:
    m = metrics(http)
    return (m["jaxinfer_num_requests_running"] == 0 and m["jaxinfer_num_requests_waiting"] == 0
            and m["jaxinfer_kv_blocks_free"] == f0)


# SC-15's server and its twin (the latency reference) are configured alike
SRV_ENGINE = dict(max_model_len=4400, num_blocks=600, max_num_seqs=32, max_num_batched_tokens=256, step_delay=0.002)


@pytest.fixture(scope="module")
def srv():
    engine = fake_engine(**SRV_ENGINE)
    with running_app(engine) as (app, ae):
        @app.get("/_debug/tasks")
        async def tasks():
            return {"tasks": len(asyncio.all_tasks())}

        with LiveServer(app) as live:
            http = httpx.Client(base_url=live.url, timeout=30)
            yield SimpleNamespace(http=http, url=live.url, port=live.port, engine=engine,
                                  f0=metrics(http)["jaxinfer_kv_blocks_free"])
            http.close()


@pytest.fixture(scope="module")
def twin():
    """A second server of the same configuration that no test disturbs: SC-15's latency reference."""
    with running_app(fake_engine(**SRV_ENGINE)) as (app, ae), LiveServer(app) as live:
        yield live.url


LONG = {"prompt": list(range(1000, 1200)), "max_tokens": 4000, "ignore_eos": True}


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", LONG),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 200}], "max_tokens": 4000,
                              "ignore_eos": True}),
])
def test_sc14_non_streaming_disconnect_aborts(srv, path, body, caplog):
    before = metrics(srv.http)
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its socket
        httpx.post(srv.url + path, json=body, timeout=httpx.Timeout(10, read=1.0))
    t_closed = time.monotonic()
    assert wait_until(lambda: idle(srv.http, srv.f0), 2.0)
    assert time.monotonic() - t_closed < 2.0
    after = metrics(srv.http)
    assert after["jaxinfer_requests_aborted_total"] == before["jaxinfer_requests_aborted_total"] + 1
    # the client's leaving is a 499, never counted as a server error (503)
    errors = 'jaxinfer_http_error_responses_total{status="%d"}'
    assert wait_until(lambda: metrics(srv.http)[errors % 499] == before[errors % 499] + 1, 2.0)
    assert metrics(srv.http)[errors % 503] == before[errors % 503]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_sc14_streaming_disconnect_after_first_chunk(srv, caplog):
    aborted = metrics(srv.http)["jaxinfer_requests_aborted_total"]
    body = {**LONG, "stream": True}
    with httpx.Client(timeout=10) as c, c.stream("POST", srv.url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                break
    assert wait_until(lambda: idle(srv.http, srv.f0), 2.0)
    assert metrics(srv.http)["jaxinfer_requests_aborted_total"] == aborted + 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_sc15_many_aborted_streams_do_not_leak(srv, twin):
    rng = random.Random(0)
    http = srv.http
    _p50_latency(srv.url)  # the pre-test round: all 200 with the expected text
    base_tasks = http.get("/_debug/tasks").json()["tasks"]
    aborted = metrics(http)["jaxinfer_requests_aborted_total"]
    # step_delay stays at 2 ms: a 512-token stream lasts >= 1 s, so reading k <= 5 events always
    # cuts it mid-generation (with no delay a loaded machine coalesced a whole stream into 3 events)
    rss0 = None
    num_read = 0
    for i in range(1, 501):
        n = rng.randint(10, 600)
        body = {"prompt": [rng.randrange(300, 40000) for _ in range(n)], "max_tokens": 512, "stream": True,
                "ignore_eos": True}
        k = rng.choice([0, 1, 5])
        assert raw_sse_request(srv.port, "/v1/completions", body, read_events=k) >= k
        num_read += k > 0
        if i % 50 == 0:
            assert wait_until(lambda: idle(http, srv.f0), 3.0), metrics(http)
            assert wait_until(lambda: http.get("/_debug/tasks").json()["tasks"] <= base_tasks, 2.0)
            if rss0 is None:
                rss0 = psutil.Process().memory_info().rss
    assert metrics(http)["jaxinfer_requests_aborted_total"] - aborted >= num_read  # each stream read from aborted
    rss = psutil.Process().memory_info().rss
    assert rss < 1.05 * rss0, (rss, rss0)
    # The latency reference is an untouched twin server measured alternately with this one, best of
    # 3 each: a pre-test baseline taken a minute earlier compared the machine's load at two moments
    # (on CI, beside another test worker, it once read 0.44 against 0.29 s with nothing leaked).
    after, reference = [], []
    for _ in range(3):
        after.append(_p50_latency(srv.url))
        reference.append(_p50_latency(twin))
    assert min(after) <= 1.2 * min(reference) + 0.05, (after, reference)


def _p50_latency(url: str, clients: int = 32) -> float:
    """32 concurrent ordinary requests: all 200 with the hand-computed text; their median latency (s)."""
    tok = tokenizer()

    async def one(c: httpx.AsyncClient, i: int) -> float:
        ids = [2000 + 7 * i, 2001 + 7 * i]
        t0 = time.monotonic()
        r = await c.post("/v1/completions", json={"prompt": ids, "max_tokens": 32, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == tok.decode(expected_ids(ids, 32))
        return time.monotonic() - t0

    async def run() -> list[float]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as c:
            return await asyncio.gather(*(one(c, i) for i in range(clients)))

    return statistics.median(asyncio.run(run()))


@pytest.fixture(scope="module")
def small():
    """max_num_seqs = 4, for queued-request cases."""
    engine = fake_engine(max_model_len=2048, num_blocks=400, max_num_seqs=4, max_num_batched_tokens=64,
                         step_delay=0.002)
    with running_app(engine) as (app, _), LiveServer(app) as live:
        http = httpx.Client(base_url=live.url, timeout=30)
        yield SimpleNamespace(http=http, url=live.url, port=live.port, f0=metrics(http)["jaxinfer_kv_blocks_free"])
        http.close()


def _start_long_requests(url: str, n: int = 4) -> list[threading.Thread]:
    """``n`` long requests of one prompt token each; returns once all ``n`` prompts are
    prefilled (``running == n`` alone can be read before the step that prefills the last
    one has been counted)."""
    http = httpx.Client(base_url=url, timeout=10)
    prefill0 = metrics(http)["jaxinfer_prefill_tokens_total"]

    def run(i):
        r = httpx.post(url + "/v1/completions", json={"prompt": [500 + i], "max_tokens": 800, "ignore_eos": True},
                       timeout=30)
        assert r.status_code == 200

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    assert wait_until(lambda: metrics(http)["jaxinfer_prefill_tokens_total"] == prefill0 + n, 5.0)
    http.close()
    return threads


Q = {"prompt": list(range(3000, 4000)), "max_tokens": 16}


@pytest.mark.parametrize("stream", [True, False])
def test_sc17_cancelled_while_queued_is_never_prefilled(small, stream):
    threads = _start_long_requests(small.url)
    assert wait_until(lambda: metrics(small.http)["jaxinfer_num_requests_running"] == 4, 3.0)
    prefill = metrics(small.http)["jaxinfer_prefill_tokens_total"]
    aborted = metrics(small.http)["jaxinfer_requests_aborted_total"]
    with send_raw_request(small.port, "/v1/completions", {**Q, "stream": stream}):
        assert wait_until(lambda: metrics(small.http)["jaxinfer_num_requests_waiting"] == 1, 2.0)
        time.sleep(0.2)
    # gone at the engine's next step after the disconnect (2 ms steps; slack for a loaded machine);
    # the prefill count below is the exact check that Q never ran
    assert wait_until(lambda: metrics(small.http)["jaxinfer_num_requests_waiting"] == 0, 0.5)
    assert metrics(small.http)["jaxinfer_requests_aborted_total"] == aborted + 1
    for t in threads:
        t.join(30)
    assert metrics(small.http)["jaxinfer_prefill_tokens_total"] == prefill  # Q's 1000 tokens never computed
    assert wait_until(lambda: idle(small.http, small.f0), 2.0)


def test_sc17_timeout_while_queued_is_504_and_never_prefilled(small):
    threads = _start_long_requests(small.url)
    assert wait_until(lambda: metrics(small.http)["jaxinfer_num_requests_running"] == 4, 3.0)
    prefill = metrics(small.http)["jaxinfer_prefill_tokens_total"]
    t0 = time.monotonic()
    r = small.http.post("/v1/completions", json={**Q, "request_timeout": 0.5})
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
    assert 0.45 < time.monotonic() - t0 < 2.0
    assert metrics(small.http)["jaxinfer_num_requests_waiting"] == 0
    for t in threads:
        t.join(30)
    assert metrics(small.http)["jaxinfer_prefill_tokens_total"] == prefill
    assert wait_until(lambda: idle(small.http, small.f0), 2.0)
