"""Offer load to a server: closed-loop concurrency or open-loop Poisson / gamma arrivals.

  * Closed loop (``request_rate=None``): ``concurrency`` workers, each sending its next
    request as soon as its previous one ends ("N concurrent clients").
  * Open loop (``request_rate=R``): requests start at arrival times whose gaps are drawn
    from a gamma distribution with shape ``burstiness`` and mean ``1 / R`` seconds
    (``burstiness = 1`` is a Poisson process; < 1 burstier, > 1 more regular; vLLM's
    knob). ``concurrency`` then optionally caps requests in flight.
Warm-up requests run first (closed loop, at most ``concurrency`` at once) and are
discarded. A tqdm bar counts finished measured requests.

With ``max_retries > 0`` a client answered 429 / 503 with ``Retry-After`` waits that long
(capped at ``max_retry_after_s``) and sends again, as a well-behaved OpenAI client does;
otherwise a 429 is final. A closed-loop client that retries at once would turn overload
into a flood of fast rejections.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Sequence

import httpx
import numpy as np
from tqdm.auto import tqdm

from jaxinfer.bench.client import ENDPOINTS, RequestResult, send_request
from jaxinfer.bench.workloads import BenchRequest


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    """How to offer the load.

    Attributes:
      base_url: server root, e.g. ``http://127.0.0.1:8000``.
      model: the ``model`` field to send.
      concurrency: closed-loop clients, or the in-flight cap of an open loop (None: no cap).
      request_rate: open-loop mean arrival rate, requests/s (None: closed loop).
      burstiness: gamma shape of the inter-arrival times (1 = Poisson).
      timeout_s: client-side limit per request, seconds.
      seed: seed of the arrival times.
      extra_body: fields merged into every request body.
      progress: show a tqdm bar.
      max_retries: resends of a request answered 429 / 503 with ``Retry-After`` (0: none).
      max_retry_after_s: cap on one wait, seconds.
      endpoint: ``"completions"`` or ``"chat"`` (`jaxinfer.bench.client.ENDPOINTS`).
    """

    base_url: str
    model: str
    concurrency: int | None = 1
    request_rate: float | None = None
    burstiness: float = 1.0
    timeout_s: float = 600.0
    seed: int = 0
    extra_body: dict | None = None
    progress: bool = True
    max_retries: int = 0
    max_retry_after_s: float = 30.0
    endpoint: str = "completions"

    def __post_init__(self) -> None:
        if self.request_rate is None and not self.concurrency:
            raise ValueError("give a concurrency (closed loop) or a request rate (open loop)")
        if self.burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        if self.max_retries < 0 or self.max_retry_after_s < 0:
            raise ValueError("max_retries and max_retry_after_s must be >= 0")
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {self.endpoint!r}; choose from {', '.join(ENDPOINTS)}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + ENDPOINTS[self.endpoint]


def arrival_gaps(rate: float, burstiness: float, n: int, seed: int = 0) -> np.ndarray:
    """Seconds between successive arrivals: gamma(shape=burstiness, scale=1/(rate*burstiness)),
    mean ``1 / rate``; all zeros for an infinite rate. Shape [n]."""
    if math.isinf(rate):
        return np.zeros(n)
    return np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), n)


async def run(cfg: LoadConfig, requests: Sequence[BenchRequest],
              warmup: Sequence[BenchRequest] = ()) -> tuple[list[RequestResult], float]:
    """Warm up, then send ``requests`` and wait for all of them.

    Returns:
      (results in request order, wall seconds of the measured phase).
    """
    n_conn = max(cfg.concurrency or len(requests), 1)
    limits = httpx.Limits(max_connections=n_conn, max_keepalive_connections=n_conn)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(cfg.timeout_s)) as client:
        if warmup:
            await _closed_loop(client, cfg, warmup, min(len(warmup), cfg.concurrency or len(warmup)), None)
        with tqdm(total=len(requests), desc="requests", disable=not cfg.progress, unit="req") as bar:
            t0 = time.perf_counter()
            if cfg.request_rate is None:
                results = await _closed_loop(client, cfg, requests, cfg.concurrency, bar)
            else:
                results = await _open_loop(client, cfg, requests, bar)
            return results, time.perf_counter() - t0


async def send_with_retries(client: httpx.AsyncClient, cfg: LoadConfig, req: BenchRequest) -> RequestResult:
    """`send_request`, resent after ``Retry-After`` up to ``cfg.max_retries`` times; the
    last attempt's result, with ``attempts`` and ``retry_wait`` filled in."""
    first = None
    for attempt in range(1, cfg.max_retries + 2):
        res = await send_request(client, cfg.url, cfg.model, req, cfg.timeout_s, cfg.extra_body, cfg.endpoint)
        first = res.start if first is None else first
        res.attempts, res.retry_wait = attempt, res.start - first
        if attempt > cfg.max_retries or not res.retryable:
            return res
        await asyncio.sleep(min(res.retry_after, cfg.max_retry_after_s))
    return res


async def _closed_loop(client, cfg: LoadConfig, requests, concurrency: int, bar) -> list[RequestResult]:
    results: list[RequestResult | None] = [None] * len(requests)
    queue = iter(range(len(requests)))

    async def worker() -> None:
        for i in queue:  # the shared iterator hands each index to exactly one worker
            results[i] = await send_with_retries(client, cfg, requests[i])
            if bar is not None:
                bar.update(1)

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(requests)))))
    return results


async def _open_loop(client, cfg: LoadConfig, requests, bar) -> list[RequestResult]:
    gaps = arrival_gaps(cfg.request_rate, cfg.burstiness, len(requests), cfg.seed)
    cap = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else None

    async def one(req: BenchRequest) -> RequestResult:
        if cap is None:
            res = await send_with_retries(client, cfg, req)
        else:
            async with cap:
                res = await send_with_retries(client, cfg, req)
        bar.update(1)
        return res

    tasks = []
    for req, gap in zip(requests, gaps):
        await asyncio.sleep(gap)
        tasks.append(asyncio.create_task(one(req)))
    return list(await asyncio.gather(*tasks))
