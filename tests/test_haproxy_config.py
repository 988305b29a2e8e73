"""`jaxinfer.cluster.haproxy_config` and `jaxinfer.cluster.haproxy_runtime` without any server: the committed
``deploy/haproxy.cfg`` is the renderer's output, HAProxy itself accepts what is rendered, and a
missing HAProxy that cannot be installed is a clear error, and HAProxy hands each event of a
stream on at once (against a few-line upstream). Routing behaviour is tested against real
servers in tests/test_cluster.py."""
from __future__ import annotations

import contextlib
import http.server
import io
import os
import socket
import stat
import subprocess
import threading
import time

import pytest

from api_helpers import REPO, free_port
from jaxinfer.cluster import haproxy_config as hc
from jaxinfer.cluster import haproxy_runtime as hx

THREE = ["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]


def rendered_cli(args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        hc.main(args)
    return out.getvalue()


def test_committed_reference_config_is_the_renderers_output():
    assert (REPO / "deploy" / "haproxy.cfg").read_text() == rendered_cli(THREE)


def directives(text: str, section: str) -> list[str]:
    """The directive lines of one section (``frontend jaxinfer``...), comments stripped."""
    lines, inside = [], False
    for raw in text.splitlines():
        line = raw.split("  #")[0].rstrip()
        if line and not line.startswith(" "):
            inside = line == section
        elif inside and line.strip() and not line.strip().startswith("#"):
            lines.append(line.strip())
    return lines


def test_policy_lines():
    text = rendered_cli(THREE)
    backend = directives(text, "backend jaxinfer")
    assert "balance hdr(X-Jaxinfer-Route-Key)" in backend and any(d.startswith("hash-type consistent") for d in backend)
    assert "option httpchk GET /health" in backend and "http-check expect status 200" in backend
    assert [d.split()[1:3] for d in backend if d.startswith("server ")] == [[f"inst{i}", a] for i, a in
                                                                            enumerate(THREE, 1)]
    defaults = directives(text, "defaults")
    assert "retry-on conn-failure" in defaults  # never a request that reached an instance
    frontend = directives(text, "frontend jaxinfer")
    keys = [d for d in frontend if d.startswith("http-request set-var(txn.route_key)")]
    assert ["X-Session-Id" in keys[0], "json_query('$.user')" in keys[1], " src " in keys[2]] == [True] * 3
    rr = rendered_cli([*THREE, "--balance", "roundrobin"])
    assert "balance roundrobin" in directives(rr, "backend jaxinfer") and "hash-type" not in rr


@pytest.mark.parametrize("balance", hc.BALANCES)
def test_haproxy_accepts_the_rendered_config(tmp_path, balance):
    binary = hx.find_haproxy()
    if binary is None:
        pytest.skip("haproxy is not installed (python -m jaxinfer.cluster installs it)")
    path = tmp_path / "haproxy.cfg"
    path.write_text(rendered_cli([*THREE, "--balance", balance]))
    hx.check_config(binary, path)
    path.write_text(path.read_text().replace("balance ", "balanse "))
    with pytest.raises(hx.HAProxyError, match="balanse"):
        hx.check_config(binary, path)


def test_relative_admin_socket_is_made_absolute(tmp_path, monkeypatch):
    """HAProxy reads a relative ``stats socket`` path as host:port and refuses the config
    (a benchmark run with a relative --out did), so the renderer writes it absolute."""
    monkeypatch.chdir(tmp_path)
    text = hc.render_config([hc.Upstream("inst1", "127.0.0.1:9001")], admin_socket="logs/admin.sock")
    assert f"stats socket {tmp_path / 'logs' / 'admin.sock'} " in text
    binary = hx.find_haproxy()
    if binary is not None:
        (tmp_path / "haproxy.cfg").write_text(text)
        hx.check_config(binary, tmp_path / "haproxy.cfg")


def test_bad_upstreams_are_refused():
    with pytest.raises(ValueError, match="at least one"):
        hc.render_config([])
    with pytest.raises(ValueError, match="unique"):
        hc.render_config([hc.Upstream("a", "h:1"), hc.Upstream("a", "h:2")])
    with pytest.raises(ValueError, match="balance"):
        hc.render_config([hc.Upstream("a", "h:1")], balance="random")


def _only_path(monkeypatch, folder) -> None:
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(hx, "_SEARCH", str(folder))


def test_missing_haproxy_without_a_package_manager_says_what_to_do(tmp_path, monkeypatch):
    _only_path(monkeypatch, tmp_path)
    with pytest.raises(hx.HAProxyError, match="apt-get install -y haproxy"):
        hx.ensure_haproxy(say=lambda m: None)


@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the install goes through sudo")
def test_failed_install_is_announced_then_reported(tmp_path, monkeypatch):
    fake = tmp_path / "apt-get"  # a package manager that always fails
    fake.write_text("#!/bin/sh\necho 'E: Unable to locate package haproxy' >&2\nexit 100\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    _only_path(monkeypatch, tmp_path)
    said = []
    with pytest.raises(hx.HAProxyError, match="could not install haproxy with apt-get.*Unable to locate"):
        hx.ensure_haproxy(say=said.append)
    assert said == ["haproxy not found: installing it with apt-get install -y haproxy"]


class _SlowStream(http.server.BaseHTTPRequestHandler):
    """An upstream that answers GETs (``/health``; ``/ports`` notes the balancer's source port
    in `ports`, keeping the connection open) and streams two SSE events 1.5 s apart."""
    protocol_version = "HTTP/1.1"
    ports: list[int] = []

    def do_GET(self):
        if self.path == "/ports":
            self.ports.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for i, event in enumerate((b"data: first\n\n", b"data: [DONE]\n\n")):
                if i:
                    time.sleep(1.5)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the test read its first event and left
            self.close_connection = True

    def log_message(self, *args):
        pass


def _seconds_to_first_event(port: int) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        t0 = time.perf_counter()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
        seen = b""
        while b"data: first" not in seen:
            chunk = s.recv(4096)
            if not chunk:
                raise AssertionError(f"stream ended before its first event: {seen!r}")
            seen += chunk
        return time.perf_counter() - t0


@pytest.fixture()
def balancer(tmp_path):
    """HAProxy with the rendered config in front of one `_SlowStream` upstream: its port."""
    binary = hx.find_haproxy()
    if binary is None:
        pytest.skip("haproxy is not installed (python -m jaxinfer.cluster installs it)")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowStream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    path = tmp_path / "haproxy.cfg"
    path.write_text(hc.render_config([hc.Upstream("inst1", f"127.0.0.1:{upstream.server_port}")],
                                     bind=f"127.0.0.1:{port}"))
    proc = subprocess.Popen([binary, "-db", "-f", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:  # until HAProxy listens and routes
            try:
                _seconds_to_first_event(port)
                break
            except (OSError, AssertionError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.shutdown()


def test_streamed_events_are_forwarded_at_once(balancer):
    """Without ``option http-no-delay`` HAProxy marks its writes MSG_MORE and the kernel held a
    stream's first event ~200 ms (every streamed TTFT through the balancer paid it); with it,
    the event reaches the client while the upstream still holds the second one."""
    times = [_seconds_to_first_event(balancer) for _ in range(3)]
    assert min(times) < 0.1, f"first event after {times} s"


def test_each_request_gets_its_own_upstream_connection(balancer):
    """Two requests on one client connection reach the instance on two connections
    (``option http-server-close``): HAProxy never reuses an idle connection to an instance,
    which the instance may be closing at that moment (HAProxy then drops the request)."""
    _SlowStream.ports.clear()
    with socket.create_connection(("127.0.0.1", balancer), timeout=10) as s:
        for _ in range(2):
            s.sendall(b"GET /ports HTTP/1.1\r\nHost: x\r\n\r\n")
            seen = b""
            while b"\r\n\r\n" not in seen:
                chunk = s.recv(4096)
                assert chunk, "the balancer closed the client's connection"
                seen += chunk
            assert seen.startswith(b"HTTP/1.1 200")
    assert len(_SlowStream.ports) == 2 and _SlowStream.ports[0] != _SlowStream.ports[1]
