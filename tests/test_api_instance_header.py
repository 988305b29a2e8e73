"""``x-jaxinfer-instance`` (`jaxinfer.entrypoints.openai.instance_header`): every response of a server names
its instance (``--instance-id``, default ``hostname:port``), whatever answered it."""
from __future__ import annotations

import socket
import sys

import httpx
import pytest

from api_helpers import REPO, LiveServer, fake_engine, server_config, wait_until
from jaxinfer.entrypoints.openai.app import create_app
from jaxinfer.engine.async_engine import AsyncEngine

sys.path.insert(0, str(REPO))
import server  # noqa: E402


def test_every_kind_of_response_names_the_instance():
    ae = AsyncEngine(fake_engine())
    app = create_app(ae, server_config(instance_id="node-7:8123", max_request_bytes=1000))
    with LiveServer(app) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        assert wait_until(lambda: http.get("/health").status_code == 200, 20, 0.05)
        ok = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        with http.stream("POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True}) as sse:
            sse.read()
        responses = [ok, sse, http.get("/health"), http.get("/metrics"), http.get("/nowhere"),
                     http.post("/v1/completions", json={"prompt": "hi", "max_tokens": -1}),
                     http.post("/v1/completions", content=b"x" * 2000)]  # 413 from the body limit
        assert [r.status_code for r in responses] == [200, 200, 200, 200, 404, 400, 413]
        assert [r.headers.get("x-jaxinfer-instance") for r in responses] == ["node-7:8123"] * len(responses)
        assert ok.headers.get_list("x-jaxinfer-instance") == ["node-7:8123"]  # once, not once per middleware


def test_no_instance_id_no_header():
    ae = AsyncEngine(fake_engine())
    with LiveServer(create_app(ae, server_config())) as live, httpx.Client(base_url=live.url, timeout=10) as http:
        assert "x-jaxinfer-instance" not in http.get("/live").headers


def test_flag_defaults_to_hostname_and_port():
    parse = server.build_parser().parse_args
    assert server.server_config(parse(["--port", "8123"])).instance_id == f"{socket.gethostname()}:8123"
    assert server.server_config(parse(["--instance-id", "a"])).instance_id == "a"


@pytest.mark.parametrize("bad", ["", " ", "caf\u00e9", "a\nb"])
def test_unusable_instance_ids_exit_2(bad, capsys):
    parser = server.build_parser()
    with pytest.raises(SystemExit) as exc:
        server.check_flags(parser, parser.parse_args(["--instance-id", bad]))
    assert exc.value.code == 2 and "instance_id" in capsys.readouterr().err
