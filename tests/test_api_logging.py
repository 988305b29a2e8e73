"""What the server writes to its log: probes stay out of the access log, and one line per
request received and finished unless ``--disable-log-requests`` (issue 11)."""
from __future__ import annotations

import logging

import httpx
import pytest

from api_helpers import LiveServer, fake_engine, server_config
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.engine.async_engine import AsyncEngine


def access_paths(caplog) -> list[str]:
    return [f"{r.args[1]} {r.args[2]}" for r in caplog.records if r.name == "uvicorn.access"]


def test_probes_are_not_access_logged(caplog):
    with LiveServer(create_app(AsyncEngine(fake_engine()), server_config())) as srv:
        caplog.set_level(logging.INFO, logger="uvicorn.access")  # after uvicorn set its own level
        with httpx.Client(base_url=srv.url, timeout=10) as http:
            assert http.get("/health").status_code in (200, 503)
            http.get("/live?verbose=1")
            http.head("/live")
            http.head("/health")
            assert http.get("/v1/models").status_code == 200
            http.get("/metrics")
    assert access_paths(caplog) == ["GET /v1/models", "GET /metrics"]


@pytest.mark.parametrize("log_requests", [True, False])
def test_request_log_lines_follow_the_flag(caplog, log_requests):
    caplog.set_level(logging.INFO, logger="jaxinfer.requests")
    ae = AsyncEngine(fake_engine(), log_requests=log_requests)
    with LiveServer(create_app(ae, server_config())) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=10,
                       json={"prompt": [5, 6, 7], "max_tokens": 4, "ignore_eos": True, "n": 2})
        assert r.status_code == 200, r.text
    lines = [r.getMessage() for r in caplog.records if r.name == "jaxinfer.requests"]
    if not log_requests:
        assert lines == []
        return
    received = [x for x in lines if ": 3 prompt tokens, max_tokens 4" in x]
    finished = [x for x in lines if " finished: length, 4 output tokens" in x]
    assert len(received) == 2 and len(finished) == 2, lines  # one per choice (n=2)
