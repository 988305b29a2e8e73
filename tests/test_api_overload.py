"""Overload: 200 or 429 (never 5xx, never a wrong answer), never-fits vs not-now, no starvation (SC-04, SC-19).

Fake-runner engines behind a real uvicorn server; concurrent clients with httpx.AsyncClient.
Every 200 is compared with the fake runner's hand-computed continuation.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time

import httpx

from api_helpers import (LiveServer, expected_ids, fake_engine, parse_metrics, running_app, sse_json, tokenizer,
                         wait_until)


def check_overload_reply(r: httpx.Response, text: str | None, expected: str) -> int:
    """200 with the expected text, or 429 + Retry-After + envelope. Returns the status."""
    assert r.status_code in (200, 429), (r.status_code, r.text)
    if r.status_code == 429:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["type"] == "rate_limit_error"
    else:
        assert text == expected
    return r.status_code


async def one_request(c: httpx.AsyncClient, ids: list[int], max_tokens: int,
                      stream: bool) -> tuple[httpx.Response, str | None]:
    body = {"prompt": ids, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if not stream:
        r = await c.post("/v1/completions", json=body)
        return r, (r.json()["choices"][0]["text"] if r.status_code == 200 else None)
    async with c.stream("POST", "/v1/completions", json=body) as r:
        raw = await r.aread()
    if r.status_code != 200:
        return r, None
    return r, "".join(ch["choices"][0]["text"] for ch in sse_json(raw))


def test_overload_4x_pool_is_200_or_429():
    """64 concurrent clients; the pool holds 16 such requests (4 blocks each of 64)."""
    engine = fake_engine(num_blocks=65, max_model_len=256, max_num_seqs=32, max_num_batched_tokens=256,
                         max_queue_len=16, step_delay=0.003)
    tok = tokenizer()
    rng = random.Random(1)
    prompts = [[rng.randrange(300, 40000) for _ in range(40)] for _ in range(64)]
    with running_app(engine, max_queue_wait=0.5) as (app, _), LiveServer(app) as live:
        async def run():
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(base_url=live.url, timeout=30, limits=limits) as c:
                return await asyncio.gather(*(one_request(c, p, 24, i % 2 == 1) for i, p in enumerate(prompts)))

        results = asyncio.run(run())
        statuses = [check_overload_reply(r, text, tok.decode(expected_ids(p, 24)))
                    for (r, text), p in zip(results, prompts)]
        assert statuses.count(200) >= 16 and statuses.count(429) >= 1, statuses
        m = parse_metrics(httpx.get(live.url + "/metrics").text)
        rejected = sum(v for k, v in m.items() if k.startswith("jaxinfer_requests_rejected_total"))
        assert rejected == statuses.count(429)
        assert wait_until(lambda: parse_metrics(httpx.get(live.url + "/metrics").text)["jaxinfer_kv_blocks_free"]
                          == 64, 2)


class StallWatch:
    """Samples the queue gauges every 50 ms; records the longest 'waiting > 0 with nothing running' spell."""

    def __init__(self, url: str):
        self.url = url
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        since = None
        with httpx.Client(base_url=self.url, timeout=5) as c:
            while not self._stop.is_set():
                m = parse_metrics(c.get("/metrics").text)
                stalled = m["jaxinfer_num_requests_waiting"] > 0 and m["jaxinfer_num_requests_running"] == 0
                now = time.monotonic()
                since = (since or now) if stalled else None
                if since is not None:
                    self.longest = max(self.longest, now - since)
                self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


def test_sc04_never_fits_is_400_not_now_is_queued_or_429():
    """B = 64 blocks (1024 tokens), C = 2048."""
    engine = fake_engine(num_blocks=65, max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=256,
                         step_delay=0.003)
    tok = tokenizer()
    with running_app(engine, max_queue_wait=3.0) as (app, _), LiveServer(app) as live, StallWatch(live.url) as watch:
        async def phase1():
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
                t0 = time.monotonic()
                r1 = c.post("/v1/completions", json={"prompt": list(range(1000, 2500)), "max_tokens": 16})
                smalls = [c.post("/v1/completions", json={"prompt": list(range(3000 + 50 * i, 3020 + 50 * i)),
                                                          "max_tokens": 16, "ignore_eos": True}) for i in range(8)]
                r1 = await r1
                r1_time = time.monotonic() - t0
                return r1, r1_time, await asyncio.gather(*smalls)

        r1, r1_time, smalls = asyncio.run(phase1())
        assert r1.status_code == 400 and r1.json()["error"]["param"] == "max_tokens" and r1_time < 1.0
        assert "95" in r1.json()["error"]["message"] and "64" in r1.json()["error"]["message"]
        for i, r in enumerate(smalls):
            assert r.status_code == 200
            assert r.json()["choices"][0]["text"] == tok.decode(expected_ids(list(range(3000 + 50 * i, 3020 + 50 * i)),
                                                                               16))

        async def phase2():
            async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
                longs = [asyncio.create_task(c.post("/v1/completions", json={
                    "prompt": list(range(5000 + 400 * i, 5300 + 400 * i)), "max_tokens": 300, "ignore_eos": True}))
                    for i in range(2)]
                await asyncio.sleep(0.3)  # the pool is busy
                r2 = await c.post("/v1/completions", json={"prompt": list(range(10000, 10600)), "max_tokens": 16})
                return r2, await asyncio.gather(*longs)

        r2, longs = asyncio.run(phase2())
        assert r2.status_code in (200, 429), r2.text  # never 400: it fits an empty pool
        if r2.status_code == 200:
            assert r2.json()["choices"][0]["text"] == tok.decode(expected_ids(list(range(10000, 10600)), 16))
        else:
            assert "retry-after" in r2.headers
        assert all(r.status_code == 200 for r in longs)
    assert watch.longest < 1.0


def test_sc19_long_prompt_is_not_starved():
    """16 closed-loop short clients keep the batch full; a 1800-token prompt arriving later gets served.

    Both bounds count engine steps (the fake runner's ``steps``), not seconds: on a loaded 2-core
    machine the wall clock measures the machine as much as the scheduler (CI once saw a 2.3 s gap).
    A short request lives 32 steps; the long prompt's prefill takes 4 chunks of <= 512 tokens.
    """
    engine = fake_engine(num_blocks=400, max_model_len=2048, max_num_seqs=16, max_num_batched_tokens=512,
                         max_queue_len=64, step_delay=0.003)
    runner = engine.runner
    with running_app(engine) as (app, _), LiveServer(app) as live:
        done_steps: list[int] = []

        async def short_client(c: httpx.AsyncClient, i: int, until: float):
            ids = list(range(2000 + 40 * i, 2032 + 40 * i))
            while time.monotonic() < until:
                r = await c.post("/v1/completions", json={"prompt": ids, "max_tokens": 32, "ignore_eos": True})
                assert r.status_code == 200
                done_steps.append(runner.steps)

        async def long_client(c: httpx.AsyncClient) -> int:
            await asyncio.sleep(1.0)
            s0 = runner.steps
            async with c.stream("POST", "/v1/completions", json={"prompt": list(range(20000, 21800)),
                                                                 "max_tokens": 16, "stream": True}) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        return runner.steps - s0
            raise AssertionError("no event")

        async def run():
            limits = httpx.Limits(max_connections=40)
            async with httpx.AsyncClient(base_url=live.url, timeout=30, limits=limits) as c:
                start = runner.steps
                until = time.monotonic() + 4.0
                shorts = [short_client(c, i, until) for i in range(16)]
                results = await asyncio.gather(long_client(c), *shorts)
                return start, results[0]

        start, ttft_steps = asyncio.run(run())
    # FIFO admission: the long prompt waits for one seat (<= one short's 32 steps), then 4 prefill chunks.
    assert ttft_steps <= 64, ttft_steps
    steps = [start] + sorted(done_steps)
    assert len(steps) > 32
    # Short requests keep finishing: never two short lifetimes without a completion.
    assert max(b - a for a, b in zip(steps, steps[1:])) <= 64, steps
