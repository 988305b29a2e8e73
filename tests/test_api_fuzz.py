"""Schema-driven fuzzing (schemathesis): no request, valid or not, gets a 5xx or a non-envelope error.

Bounded: a fixed number of Hypothesis examples per operation (every operation of
``/openapi.json``: completions, chat, ``/v1/responses`` and its ``GET`` / ``DELETE``, ...)
against a fake-runner engine. The only 5xx allowed is a 504 for a request that asked for a
tiny ``request_timeout``. ``/v1/embeddings`` is fuzzed a second time against a ``--runner pooling``
engine (the first app answers it 400). After the run both engines are alive, idle, and hold no
KV block.
"""
from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402

from api_helpers import fake_engine, server_config, wait_until  # noqa: E402
from jaxinfer.entrypoints.openai.app import create_app  # noqa: E402
from jaxinfer.engine.async_engine import AsyncEngine  # noqa: E402

ASYNC_ENGINE = AsyncEngine(lambda: fake_engine(max_model_len=128, num_blocks=129, max_queue_len=16))
APP = create_app(ASYNC_ENGINE, server_config())
POOLING_ENGINE = AsyncEngine(lambda: fake_engine(max_model_len=128, num_blocks=129, max_queue_len=16,
                                                 max_num_batched_tokens=32, engine_runner="pooling"))
POOLING_APP = create_app(POOLING_ENGINE, server_config())


def without_lifespan(app):
    """The app, minus lifespan events: the test client opens and closes it per call, and
    the app's lifespan would shut the engine down each time (the fixture owns it here)."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await app(scope, receive, send)
    return wrapped


schema = schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(APP))
pooling_schema = schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(POOLING_APP)).include(
    path="/v1/embeddings")


@pytest.fixture(scope="module", autouse=True)
def engine_thread():
    for ae in (ASYNC_ENGINE, POOLING_ENGINE):
        ae.start()
        assert ae.ready_event.wait(30)
    yield
    assert ASYNC_ENGINE.is_healthy  # nothing killed the engine
    assert POOLING_ENGINE.is_healthy
    for ae in (ASYNC_ENGINE, POOLING_ENGINE):
        assert wait_until(lambda: _idle(ae.engine.snapshot()), 10), ae.engine.snapshot()
    for ae in (ASYNC_ENGINE, POOLING_ENGINE):
        ae.shutdown()


def _idle(snap) -> bool:
    """Nothing running or queued, every KV block free (no leak)."""
    return snap.num_running == 0 and snap.num_waiting == 0 and snap.kv_blocks_free == snap.kv_blocks_total


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    check_response(case)


@pooling_schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors_from_embeddings(case):
    check_response(case)


def check_response(case):
    """No 5xx but a requested 504; every error in the OpenAI envelope."""
    r = case.call()
    if r.status_code == 504:
        assert r.json()["error"]["type"] == "timeout"
        return
    assert r.status_code < 500, (r.status_code, r.text, case.body)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
