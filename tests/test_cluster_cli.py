"""``python -m jaxinfer.cluster`` refuses bad flags before it starts anything (no HAProxy or
server needed); the running cluster is tested in tests/test_cluster.py."""
from __future__ import annotations

import pytest

from jaxinfer import cluster


@pytest.mark.parametrize("argv,message", [
    (["--instances", "0"], "instances must be >= 1"),
    (["--instance-id", "x"], "--instance-id is set by the launcher"),
    (["--max-num-seqs", "0"], "max_num_seqs"),  # server.py's own checks
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_bad_flags_exit_2_before_starting(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cluster.main(["--run-dir", str(tmp_path), *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was started or written


def test_ports_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        cluster.Cluster(2, port=8000, ports=[8001, 8001])
    with pytest.raises(ValueError, match="distinct"):
        cluster.Cluster(2, port=8000, ports=[8000, 8001])


def test_rolling_restart_without_a_running_cluster_says_so(tmp_path, capsys):
    assert cluster.main(["--rolling-restart", "--run-dir", str(tmp_path)]) == 1
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
