"""One streaming request and the timings read off its SSE stream.

Endpoints (`ENDPOINTS`): ``completions`` (``POST /v1/completions``, the prompt as given,
token ids or text) and ``chat`` (``POST /v1/chat/completions``, the prompt text as the
one user message; text arrives in ``choices[].delta.content`` instead of ``text``).

Per request (all times ``time.perf_counter()`` seconds on the client):
  * TTFT: request sent -> first event carrying non-empty text.
  * ITL: gaps between successive text-carrying events (an event may carry several tokens
    when the server coalesces them; vLLM's benchmark measures ITL the same way).
  * E2E latency: request sent -> ``data: [DONE]``.
  * TPOT: ``(E2E - TTFT) / (output_tokens - 1)``, the mean time per output token after
    the first; output tokens come from the final ``usage`` chunk
    (``stream_options.include_usage``), else from the number of text events.
Prompt tokens: ``usage.prompt_tokens`` is kept as ``prompt_tokens``. For chat it includes
the tokens the chat template adds around the message, so `RequestResult.input_tokens`
(what throughput counts) is then the raw prompt's own count, ``prompt_len``.
Outcomes: ``ok`` (200 and a complete stream), ``http_429``, ``http_4xx`` (other 4xx),
``http_5xx``, ``timeout`` (client-side limit), ``client_error`` (connection / protocol
failure), ``stream_error`` (200, then an error event or a stream cut before ``[DONE]``).
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import httpx

from jaxinfer.bench.workloads import BenchRequest

OUTCOMES = ("ok", "http_429", "http_4xx", "http_5xx", "timeout", "client_error", "stream_error")
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclasses.dataclass
class RequestResult:
    """What one request measured (seconds; None where it never got that far).

    Attributes:
      outcome: one of `OUTCOMES`.
      status: HTTP status, None if no response arrived.
      prompt_len, output_len: the requested lengths (tokens).
      prompt_tokens, output_tokens: as reported by ``usage`` (output falls back to events).
      start: send time (perf_counter seconds).
      ttft, e2el: first-text and end-to-end latencies (s).
      itl: gaps between text events (s).
      retry_after: the ``Retry-After`` header of a 429 / 503 (s).
      error: a short description of a failure.
      attempts: sends it took (> 1 when the load generator retried a 429 / 503).
      retry_wait: seconds from the first send to the last one (0 without retries);
        ``ttft`` and ``e2el`` count from the last send, ``ttft + retry_wait`` is what the
        user waited for the first token.
      endpoint: the `ENDPOINTS` key it was sent to.
    """

    outcome: str
    status: int | None
    prompt_len: int
    output_len: int
    start: float
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ttft: float | None = None
    e2el: float | None = None
    itl: list[float] = dataclasses.field(default_factory=list)
    retry_after: float | None = None
    error: str = ""
    attempts: int = 1
    retry_wait: float = 0.0
    endpoint: str = "completions"

    @property
    def input_tokens(self) -> int:
        """Prompt tokens counted for throughput: the server's ``usage`` for completions
        (``prompt_len`` if it sent none); for chat always ``prompt_len``, the raw text's
        tokens, leaving out what the chat template adds."""
        if self.endpoint == "chat" or self.prompt_tokens is None:
            return self.prompt_len
        return self.prompt_tokens

    @property
    def retryable(self) -> bool:
        """A 429 or 503 that told the client when to come back (``Retry-After``)."""
        return self.status in (429, 503) and self.retry_after is not None

    @property
    def tpot(self) -> float | None:
        """Mean seconds per output token after the first (None with fewer than 2 tokens)."""
        if self.outcome != "ok" or self.output_tokens < 2 or self.ttft is None:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)


def completion_payload(model: str, req: BenchRequest, extra: dict | None = None) -> dict:
    """The ``/v1/completions`` body: exact output length (``ignore_eos``), greedy, streamed with usage."""
    body = {"model": model, "prompt": req.prompt, "max_tokens": req.output_len, "ignore_eos": True,
            "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    body.update(extra or {})
    return body


def chat_payload(model: str, req: BenchRequest, extra: dict | None = None) -> dict:
    """The ``/v1/chat/completions`` body: the prompt text as one user message, otherwise as
    `completion_payload` (``max_completion_tokens`` is chat's name for ``max_tokens``).

    Raises:
      ValueError: the prompt is token ids (chat messages are text: use text prompts).
    """
    if not isinstance(req.prompt, str):
        raise ValueError("the chat endpoint needs text prompts (--prompt-format text)")
    body = {"model": model, "messages": [{"role": "user", "content": req.prompt}],
            "max_completion_tokens": req.output_len, "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    body.update(extra or {})
    return body


def _chunk_text(choice: dict) -> str | None:
    """The text a streamed choice carries: ``text`` (completions) or ``delta.content`` (chat)."""
    return choice.get("text") or (choice.get("delta") or {}).get("content")


def classify_status(status: int) -> str:
    """HTTP status -> outcome name (200 is decided by the stream)."""
    if status == 429:
        return "http_429"
    if 400 <= status < 500:
        return "http_4xx"
    if status >= 500:
        return "http_5xx"
    return "ok" if status == 200 else "client_error"


async def send_request(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest,
                       timeout_s: float = 600.0, extra: dict | None = None,
                       endpoint: str = "completions") -> RequestResult:
    """POST one streaming request and time it. Never raises for HTTP or network failures.

    Args:
      client: shared client (connection pool).
      url: full endpoint URL (``.../v1/completions`` or ``.../v1/chat/completions``).
      timeout_s: limit on the whole request, seconds.
      extra: fields merged into the body.
      endpoint: ``"completions"`` or ``"chat"``: the body's shape (`ENDPOINTS`).

    Raises:
      ValueError: ``endpoint`` is unknown, or chat with a token-id prompt.
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; choose from {', '.join(ENDPOINTS)}")
    body = (chat_payload if endpoint == "chat" else completion_payload)(model, req, extra)
    res = RequestResult("client_error", None, req.prompt_len, req.output_len, time.perf_counter(), endpoint=endpoint)
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body) as resp:
                res.status = resp.status_code
                if resp.status_code != 200:
                    await _read_failure(resp, res)
                    return res
                await _read_stream(resp, res)
    except (TimeoutError, httpx.TimeoutException):
        res.outcome, res.error = "timeout", f"no complete answer within {timeout_s:g} s"
    except httpx.HTTPError as exc:
        res.outcome, res.error = "client_error", f"{type(exc).__name__}: {exc}"
    except ValueError as exc:  # an event that is not JSON
        res.outcome, res.error = "stream_error", f"bad event: {exc}"
    return res


async def _read_failure(resp: httpx.Response, res: RequestResult) -> None:
    res.outcome = classify_status(resp.status_code)
    body = (await resp.aread()).decode(errors="replace")
    res.error = body[:300]
    if "retry-after" in resp.headers:
        try:
            res.retry_after = float(resp.headers["retry-after"])
        except ValueError:
            pass


async def _read_stream(resp: httpx.Response, res: RequestResult) -> None:
    """Consume SSE ``data:`` lines, timing text events; sets the outcome."""
    last, events, error = None, 0, None
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        now = time.perf_counter()
        if data == "[DONE]":
            res.e2el = now - res.start
            break
        obj = json.loads(data)
        if "error" in obj:
            error = json.dumps(obj["error"])[:300]
            continue
        if obj.get("usage"):
            res.prompt_tokens = obj["usage"].get("prompt_tokens")
            res.output_tokens = obj["usage"].get("completion_tokens", 0)
        if any(_chunk_text(c) for c in obj.get("choices") or []):
            events += 1
            if last is None:
                res.ttft = now - res.start
            else:
                res.itl.append(now - last)
            last = now
    res.output_tokens = res.output_tokens or events
    if error is not None:
        res.outcome, res.error = "stream_error", error
    elif res.e2el is None:
        res.outcome, res.error = "stream_error", "stream ended before [DONE]"
    elif res.ttft is None:
        res.outcome, res.error = "stream_error", "no text in the stream"
    else:
        res.outcome = "ok"
