"""Shared pieces of the HTTP API tests: fake-runner engines, apps, live servers, SSE parsing.

The fake runner's next token is ``last + 1`` (tests/fakes.py), so expected outputs are
computed by hand; the tokenizer is the real SmolLM2 one.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from fakes import FakeRunner
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.entrypoints.openai.config import ServerConfig
from jaxinfer.engine.async_engine import AsyncEngine
from jaxinfer.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from jaxinfer.engine.llm_engine import LLMEngine
from jaxinfer.tokenizer.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]
MODEL = "test-model"
V = 49152  # SmolLM2's vocabulary
EOS = 2  # <|im_end|>
EOS_B = 0  # <|endoftext|>: a second EOS id from the "generation config" (SC-13)

_TOKENIZER: Tokenizer | None = None


def tokenizer() -> Tokenizer:
    """The real SmolLM2 tokenizer (converted once)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        from jaxinfer.weights.catalog import ensure_default_weights

        _TOKENIZER = Tokenizer.from_dir(ensure_default_weights(REPO / "weights"))
    return _TOKENIZER


def model_config(eos=(EOS, EOS_B), vocab=V) -> ModelConfig:
    return ModelConfig(vocab_size=vocab, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1,
                       num_key_value_heads=1, head_dim=8, bos_token_id=1, eos_token_ids=tuple(eos))


def fake_engine(*, num_blocks=257, max_model_len=256, max_num_seqs=8, max_num_batched_tokens=64, max_queue_len=64,
                watermark=0.15, step_delay=0.0, runner=None, tok=None, vocab=V, eos=(EOS, EOS_B),
                grammar=None, engine_runner="generate", pooling_type="last") -> LLMEngine:
    """An engine over `FakeRunner` (``num_blocks`` includes the null block); ``grammar``: a
    `jaxinfer.engine.protocol.SharedGrammar` to share with other engines, or None;
    ``engine_runner``: the config's ``runner`` (``"pooling"``: an embeddings server)."""
    config = EngineConfig(model_path="fake", scheduler=SchedulerConfig(
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        max_queue_len=max_queue_len), cache=CacheConfig(num_blocks=num_blocks, watermark=watermark),
        runner=engine_runner, pooling_type=pooling_type)
    runner = runner or FakeRunner(vocab, step_delay=step_delay)
    return LLMEngine(config, model_config(eos, vocab), runner, num_blocks, tok or tokenizer(), grammar=grammar)


def server_config(**kw) -> ServerConfig:
    kw.setdefault("served_model_name", MODEL)
    return ServerConfig(**kw)


@contextlib.contextmanager
def running_app(engine_or_builder, **config_kw):
    """(app, async_engine) with the engine thread started and ready; shut down after."""
    ae = AsyncEngine(engine_or_builder)
    app = create_app(ae, server_config(**config_kw))
    ae.start()
    ae.ready_event.wait(30)
    try:
        yield app, ae
    finally:
        ae.shutdown()


def client(app) -> httpx.AsyncClient:
    """In-process client (no lifespan: the caller started the engine)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30)


def expected_ids(prompt_ids: list[int], n: int) -> list[int]:
    """The fake runner's greedy continuation: last + 1, last + 2, ..."""
    return [(prompt_ids[-1] + 1 + i) % V for i in range(n)]


def sse_events(raw: bytes) -> list[str]:
    """Split an SSE body into its ``data:`` payloads, checking the framing on the way."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-50:]
    events = text[:-2].split("\n\n")
    out = []
    for ev in events:
        assert ev.startswith("data: ") and "\n" not in ev, ev
        out.append(ev[len("data: "):])
    return out


def sse_json(raw: bytes) -> list[dict]:
    events = sse_events(raw)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return [json.loads(e) for e in events[:-1]]


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name{labels}: value}; the ``model_name`` label every series
    carries is left out of the keys (``jaxinfer_kv_blocks_free``, ``...{reason="queue_full"}``)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items() if k != "model_name")
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """A real uvicorn server on 127.0.0.1 in a thread (for disconnects and raw streams).

    Use as a context manager; ``url`` is its base URL.
    """

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=5, log_config=None)  # uvicorn logs reach caplog
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


async def await_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval)
    return await predicate()


# ----------------------------------------------------------------------------- sync helpers

REFERENCE = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def metric(http, name: str) -> float:
    """One value from ``GET /metrics`` (``name`` may carry labels)."""
    return parse_metrics(http.get("/metrics").text)[name]


def fake_reference_text() -> str:
    """The fake runner's answer to `REFERENCE`, computed by hand."""
    tok = tokenizer()
    return tok.decode(expected_ids(tok.encode(REFERENCE["prompt"]), 8))


def assert_error(r, status: int, param=None, type_=None):
    """An OpenAI error envelope with this status (and param / type when given)."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if type_ is not None:
        assert err["type"] == type_, err
    return err


def assert_alive(http, reference_text: str, free_blocks: float | None = None) -> None:
    """The SC "engine alive" check: health 200, reference output unchanged, blocks back to F0."""
    assert http.get("/health").status_code == 200
    r = http.post("/v1/completions", json=REFERENCE)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == reference_text
    if free_blocks is not None:
        assert wait_until(lambda: metric(http, "jaxinfer_kv_blocks_free") == free_blocks, 2.0)
        assert metric(http, "jaxinfer_num_requests_running") == 0


def send_raw_request(port: int, path: str, body: dict, timeout: float = 10.0) -> socket.socket:
    """POST ``body`` over a new raw socket (``Connection: close``) and return the open socket."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(head + payload)
    return s


def raw_sse_request(port: int, path: str, body: dict, read_events: int, timeout: float = 10.0) -> int:
    """POST over a raw socket, read ``read_events`` SSE events (0: close at once), close.

    Returns the number of events actually read (fewer if the stream ended).
    """
    with send_raw_request(port, path, body, timeout) as s:
        buf = b""
        while buf.count(b"\n\n") < read_events:  # events end in \n\n (the header block in \r\n\r\n)
            data = s.recv(65536)
            if not data:
                break
            buf += data
        return buf.count(b"data: ")
