"""Schema-driven fuzzing (schemathesis): no request, valid or not, gets a 5xx or a non-envelope error.

Bounded: a fixed number of Hypothesis examples per operation (every operation of
``/openapi.json``: completions, chat, ``/v1/responses`` and its ``GET`` / ``DELETE``, ...)
against a fake-runner engine. The only 5xx allowed is a 504 for a request that asked for a
tiny ``request_timeout``. After the run the engine is alive, idle, and holds no KV block.
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


async def app_without_lifespan(scope, receive, send):
    """The app, minus lifespan events: the test client opens and closes it per call, and
    the app's lifespan would shut the engine down each time (the fixture owns it here)."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await APP(scope, receive, send)


schema = schemathesis.openapi.from_asgi("/openapi.json", app_without_lifespan)


@pytest.fixture(scope="module", autouse=True)
def engine_thread():
    ASYNC_ENGINE.start()
    assert ASYNC_ENGINE.ready_event.wait(30)
    yield
    assert ASYNC_ENGINE.is_healthy  # nothing killed the engine
    assert wait_until(lambda: _idle(ASYNC_ENGINE.engine.snapshot()), 10), ASYNC_ENGINE.engine.snapshot()
    ASYNC_ENGINE.shutdown()


def _idle(snap) -> bool:
    """Nothing running or queued, every KV block free (no leak)."""
    return snap.num_running == 0 and snap.num_waiting == 0 and snap.kv_blocks_free == snap.kv_blocks_total


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    r = case.call()
    if r.status_code == 504:
        assert r.json()["error"]["type"] == "timeout"
        return
    assert r.status_code < 500, (r.status_code, r.text, case.body)
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
