"""``python -m jaxinfer.cluster`` refuses bad flags before it starts anything (no HAProxy or
server needed); the running cluster is tested in tests/test_cluster.py."""
from __future__ import annotations

import pytest

from jaxinfer.cluster import launcher as cluster
from jaxinfer.cluster import cli as cluster_cli


@pytest.mark.parametrize("argv,message", [
    (["--instances", "0"], "instances must be >= 1"),
    (["--instance-id", "x"], "--instance-id would name every instance alike"),
    (["--max-num-seqs", "0"], "max_num_seqs"),  # server.py's own checks
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_flags_exit_2_before_starting(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cluster_cli.main(["--run-dir", str(tmp_path), *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err
    assert "--speculative-config" not in err  # the error line, not server.py's ~50 lines of usage
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def test_a_busy_balancer_port_fails_before_any_instance_starts(tmp_path, capsys, monkeypatch):
    import socket

    spawned = []
    monkeypatch.setattr(cluster.Cluster, "_spawn", lambda self, inst: spawned.append(inst))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert cluster_cli.main(["--run-dir", str(tmp_path), "--port", str(port), "--base-port", str(port + 1)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err and spawned == []


class _Proc:
    def __init__(self, alive: bool):
        self.alive, self.pid, self.returncode = alive, 1, None if alive else -9

    def poll(self):
        return None if self.alive else self.returncode

    def send_signal(self, sig):
        self.alive = False

    def wait(self, timeout=None):
        return 0


def test_rolling_restart_restarts_a_down_instance_first_without_draining_it(tmp_path, monkeypatch):
    """With inst2 dead, draining inst1 first would leave no instance up (every request 503)
    until inst1 was warm again; inst2 goes first, and only live instances are drained."""
    c = cluster.Cluster(3, port=8000, run_dir=tmp_path, say=lambda m: None)
    for inst, alive in zip(c.instances, (True, False, True)):
        inst.proc = _Proc(alive)
    events = []
    monkeypatch.setattr(c, "server_stats", lambda: {i.name: {"status": "UP" if i.proc.poll() is None else "DOWN",
                                                              "scur": "0"} for i in c.instances})
    monkeypatch.setattr(cluster.hx, "set_state", lambda sock, backend, name, state: events.append((state, name)))

    def spawn(inst):
        events.append(("start", inst.name))
        inst.proc = _Proc(True)
    monkeypatch.setattr(c, "_spawn", spawn)
    monkeypatch.setattr(c, "_wait_warm", lambda inst: None)
    monkeypatch.setattr(c, "_wait_all_up", lambda insts, timeout: None)
    monkeypatch.setattr(c, "_write_state", lambda: None)
    c.rolling_restart()
    assert [e for e in events if e[0] == "start"] == [("start", "inst2"), ("start", "inst1"), ("start", "inst3")]
    assert ("drain", "inst2") not in events and ("drain", "inst1") in events and ("drain", "inst3") in events


def test_ports_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        cluster.Cluster(2, port=8000, ports=[8001, 8001])
    with pytest.raises(ValueError, match="distinct"):
        cluster.Cluster(2, port=8000, ports=[8000, 8001])


def test_rolling_restart_without_a_running_cluster_says_so(tmp_path, capsys):
    assert cluster_cli.main(["--rolling-restart", "--run-dir", str(tmp_path)]) == 1
    assert f"no running cluster found in {tmp_path}" in capsys.readouterr().err


def test_admin_socket_moves_to_a_short_path_when_run_dir_is_long(tmp_path):
    short = cluster.Cluster(1, port=8000, ports=[8001], run_dir=tmp_path / "r")
    long_dir = tmp_path / ("x" * 100)
    moved = cluster.Cluster(1, port=8000, ports=[8001], run_dir=long_dir)
    if len(str(short.admin_socket)) <= cluster.MAX_SOCKET_PATH:
        assert short.admin_socket == (tmp_path / "r" / "haproxy.sock").absolute()
    sock = moved.admin_socket
    assert len(str(sock)) <= cluster.MAX_SOCKET_PATH and sock.name == "haproxy.sock"
    assert moved.admin_socket == sock  # one path for the cluster's lifetime
    assert sock.parent.is_dir() and not str(sock).startswith(str(long_dir))
    moved.stop()  # nothing started: removes the private folder
    assert not sock.parent.exists()
