"""``python -m jaxinfer.cluster --instances N [server flags]``: N servers behind HAProxy on one machine.

Owns the single-machine cluster: it starts N ``server.py`` processes on loopback ports
(``--base-port``, then +1, ...), waits until each is warm (``GET /health`` 200), then starts
HAProxy in front of them on ``--host:--port`` (127.0.0.1:8000) with the configuration of
`jaxinfer.cluster.haproxy_config` (consistent hashing on ``X-Session-Id`` / the ``user`` field / the
client address, active checks on ``/health``). It prints where everything listens and
writes its state under ``--run-dir``; its command line is `jaxinfer.cluster.cli`. Ctrl+C or
SIGTERM stops it all cleanly: HAProxy stops
accepting and finishes its open connections, the servers drain their in-flight requests.

Rolling restart (`Cluster.rolling_restart`): one instance at a time, mark it ``drain`` in
HAProxy (no new requests; sessions that hashed to it go to the others meanwhile), wait until
it has no request in flight, stop it (SIGTERM), start it again with the same flags, wait
until it is warm and HAProxy's check sees it up, then the next one. Instances that are down
(exited, or failing their check) go first, with no drain, so that the cluster has its full
capacity back before a live one is drained. A running launcher does
this on SIGHUP; ``python -m jaxinfer.cluster --rolling-restart [--port P]`` sends that signal
and waits until it is done. An instance that dies on its own is reported, and HAProxy's
check takes it out of rotation; it is not restarted automatically.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from jaxinfer.cluster import haproxy_runtime as hx
from jaxinfer.cluster.haproxy_config import BACKEND, BALANCES, HealthCheck, Upstream, render_config

SERVER_SCRIPT = Path(__file__).resolve().parents[2] / "server.py"
OWN_SERVER_FLAGS = ("--host", "--port", "--instance-id")  # the launcher sets these per instance
MAX_SOCKET_PATH = 97  # HAProxy 2.6 refuses a longer ``stats socket`` path ("too long (max 97)")


class ClusterError(RuntimeError):
    """An instance or HAProxy failed to start, or did not become ready in time."""


@dataclasses.dataclass
class Instance:
    """One server process of the cluster.

    Attributes:
      name: HAProxy's name for it (``inst1``, ``inst2``...).
      port: its loopback HTTP port.
      log_path: where its stdout and stderr go (appended across restarts).
      proc: the running process (None before the first start).
    """

    name: str
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def upstream(self) -> Upstream:
        return Upstream(self.name, f"127.0.0.1:{self.port}")


class Cluster:
    """N jaxinfer servers and one HAProxy, as child processes.

    Args:
      instances: how many servers (>= 1).
      server_args: ``server.py`` flags for every instance (not ``--host``, ``--port`` or
        ``--instance-id``, which the launcher sets).
      host, port: where HAProxy listens.
      base_port: the first instance's port (default: ``port + 1``); the others follow it.
      ports: the instances' ports, one each (instead of ``base_port``).
      run_dir: configuration, admin socket, logs and ``state.json`` (default:
        ``<tmp>/jaxinfer-cluster-<port>``).
      balance: ``"hash"`` or ``"roundrobin"`` (the benchmark's baseline).
      check: HAProxy's health-check timing.
      ready_timeout: seconds an instance may take to become warm (loading + compiling).
      stop_timeout: seconds a stopping process gets before SIGKILL (the servers' drain).
      env: environment of the server processes (default: this one's).
      say: where progress lines go.
      stats_bind: ``host:port`` for HAProxy's stats page (``/stats``) and its Prometheus
        metrics (``/metrics``), or None for none.
    Raises:
      ValueError: bad arguments (checked before anything starts).
    """

    def __init__(self, instances: int, server_args: list[str] = (), *, host: str = "127.0.0.1", port: int = 8000,
                 base_port: int | None = None, ports: list[int] | None = None, run_dir: str | Path | None = None,
                 balance: str = "hash",
                 check: HealthCheck = HealthCheck(), ready_timeout: float = 900.0, stop_timeout: float = 40.0,
                 env: dict | None = None, say: Callable[[str], None] = print, stats_bind: str | None = None):
        if instances < 1:
            raise ValueError(f"instances must be >= 1, got {instances}")
        if balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
        first = port + 1 if base_port is None else base_port
        ports = list(range(first, first + instances)) if ports is None else list(ports)
        if len(ports) != instances or len(set(ports)) != instances or port in ports:
            raise ValueError(f"need {instances} distinct instance ports other than {port}, got {ports}")
        clash = [a.split("=")[0] for a in server_args if a.split("=")[0] in OWN_SERVER_FLAGS]
        if clash and clash[0] == "--instance-id":
            raise ValueError("--instance-id would name every instance alike: the launcher leaves each its default "
                             "(hostname:port), which the x-jaxinfer-instance header shows")
        if clash:
            raise ValueError(f"{clash[0]} is set by the launcher for each instance (use --host / --port / --base-port)")
        self.server_args = list(server_args)
        self.host, self.port, self.balance, self.check, self.stats_bind = host, port, balance, check, stats_bind
        self.run_dir = Path(run_dir or default_run_dir(port))
        self.ready_timeout, self.stop_timeout, self.env, self.say = ready_timeout, stop_timeout, env, say
        self.instances = [self._new_instance(i, p) for i, p in enumerate(ports)]
        self.haproxy: subprocess.Popen | None = None
        self._replaced: list[subprocess.Popen] = []  # HAProxy processes finishing their connections after a reload
        self.haproxy_binary: str | None = None
        self.rolling_restarts = 0
        self._lock = threading.Lock()

    # ----- paths ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @functools.cached_property
    def admin_socket(self) -> Path:
        """``<run_dir>/haproxy.sock``, or, where that path is longer than HAProxy accepts
        (`MAX_SOCKET_PATH`), the same name in a private folder under /tmp."""
        path = (self.run_dir / "haproxy.sock").absolute()
        if len(str(path)) <= MAX_SOCKET_PATH:
            return path
        return Path(tempfile.mkdtemp(prefix="jaxinfer-", dir="/tmp" if os.path.isdir("/tmp") else None)) / path.name

    @property
    def state_path(self) -> Path:
        """``state.json``: launcher pid, instances, completed rolling restarts (while running)."""
        return self.run_dir / "state.json"

    @property
    def config_path(self) -> Path:
        return self.run_dir / "haproxy.cfg"

    def _new_instance(self, index: int, port: int) -> Instance:
        return Instance(f"inst{index + 1}", port, self.run_dir / f"inst{index + 1}.log")

    # ----- start / stop ---------------------------------------------------------------------
    def start(self) -> "Cluster":
        """Install HAProxy if needed, start every instance, wait until all are warm, start HAProxy.

        Raises:
          ClusterError: the balancer's (or stats) address is taken, an instance exited or stayed
            unready past ``ready_timeout`` (its log's last lines are in the message), or HAProxy
            did not come up.
          jaxinfer.cluster.haproxy_runtime.HAProxyError: HAProxy missing and not installable.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.state_path.unlink(missing_ok=True)  # a stale one would point --rolling-restart at a dead pid
        for address in filter(None, [f"{self.host}:{self.port}", self.stats_bind]):
            _check_free(address)  # before minutes of loading and warming up the instances
        self.haproxy_binary = hx.ensure_haproxy(self.say)
        try:
            for inst in self.instances:
                self._spawn(inst)
            self.say(f"waiting for {len(self.instances)} instance(s) to load and warm up (logs in {self.run_dir})")
            for inst in self.instances:
                self._wait_warm(inst)
            self._start_haproxy()
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> None:
        """Stop HAProxy (soft: finish open connections) and every instance (SIGTERM: drain), then
        SIGKILL whatever is still running after ``stop_timeout`` s. Idempotent."""
        balancers = [p for p in [self.haproxy, *self._replaced] if p is not None and p.poll() is None]
        procs = balancers + [i.proc for i in self.instances if i.proc is not None and i.proc.poll() is None]
        for proc in balancers:
            proc.send_signal(signal.SIGUSR1)  # soft stop
        for inst in self.instances:
            if inst.proc is not None and inst.proc.poll() is None:
                inst.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.admin_socket.unlink(missing_ok=True)
        if self.admin_socket.parent != self.run_dir.absolute():  # the private /tmp folder of a long run_dir
            shutil.rmtree(self.admin_socket.parent, ignore_errors=True)
        self.state_path.unlink(missing_ok=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _spawn(self, inst: Instance) -> None:
        if not SERVER_SCRIPT.is_file():
            raise ClusterError(f"{SERVER_SCRIPT} not found: run the cluster from a jaxinfer checkout")
        cmd = [sys.executable, str(SERVER_SCRIPT), *self.server_args, "--host", "127.0.0.1", "--port", str(inst.port)]
        with open(inst.log_path, "ab") as log:  # the child keeps its own descriptor
            inst.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)  # Ctrl+C reaches the launcher only

    def _wait_warm(self, inst: Instance) -> None:
        deadline = time.monotonic() + self.ready_timeout
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < deadline:
                if inst.proc.poll() is not None:
                    raise ClusterError(f"{inst.name} (port {inst.port}) exited with status {inst.proc.returncode}:\n"
                                       + _tail(inst.log_path))
                try:
                    if http.get(f"{inst.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.25)
        raise ClusterError(f"{inst.name} (port {inst.port}) not ready after {self.ready_timeout:g} s:\n"
                           + _tail(inst.log_path))

    # ----- HAProxy --------------------------------------------------------------------------
    def _start_haproxy(self) -> None:
        """(Re)write the configuration and start HAProxy; a running one hands over (``-sf``)."""
        text = render_config([i.upstream for i in self.instances], bind=f"{self.host}:{self.port}",
                             balance=self.balance, check=self.check, admin_socket=str(self.admin_socket),
                             stats_bind=self.stats_bind)
        self.config_path.write_text(text)
        hx.check_config(self.haproxy_binary, self.config_path)
        old = self.haproxy if self.haproxy is not None and self.haproxy.poll() is None else None
        cmd = [self.haproxy_binary, "-db", "-f", str(self.config_path)] + (["-sf", str(old.pid)] if old else [])
        with open(self.run_dir / "haproxy.log", "ab") as log:
            self.haproxy = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        self._wait_all_up(self.instances, 30.0)
        if old is not None:
            self._replaced.append(old)  # it exits by itself once its connections end

    def _wait_all_up(self, instances: list[Instance], timeout: float) -> None:
        names = {i.name for i in instances}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.haproxy.poll() is not None:
                raise ClusterError(f"haproxy exited with status {self.haproxy.returncode}:\n"
                                   + _tail(self.run_dir / "haproxy.log"))
            try:
                stats = hx.server_stats(self.admin_socket, BACKEND)
                if all(stats.get(n, {}).get("status") == "UP" for n in names):
                    return
            except OSError:
                pass  # socket not there yet
            time.sleep(0.1)
        raise ClusterError(f"haproxy did not see {sorted(names)} up within {timeout:g} s")

    def server_stats(self) -> dict[str, dict[str, str]]:
        """HAProxy's ``show stat`` rows of the instances, by name (`jaxinfer.cluster.haproxy_runtime.server_stats`)."""
        return hx.server_stats(self.admin_socket, BACKEND)

    # ----- changes while running -------------------------------------------------------------
    def add_instance(self, port: int | None = None) -> Instance:
        """Start one more instance (on ``port``, default: after the highest one), wait until it is
        warm, then reload HAProxy with it (the old HAProxy process finishes its open connections). Returns the new instance.

        Raises:
          ClusterError: as `start`.
        """
        with self._lock:
            port = max(i.port for i in self.instances) + 1 if port is None else port
            inst = self._new_instance(len(self.instances), port)
            self._spawn(inst)
            try:
                self._wait_warm(inst)
            except BaseException:
                inst.proc.kill()
                inst.proc.wait()
                raise
            self.instances.append(inst)
            self._start_haproxy()
            self._write_state()
            return inst

    def rolling_restart(self, drain_timeout: float = 300.0, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Restart the instances one at a time without failing a request (module docstring).

        Args:
          drain_timeout: seconds to wait for an instance's in-flight requests before stopping
            it anyway (its own SIGTERM drain then still gives them ``--shutdown-timeout``).
          should_stop: polled between steps; True ends the restart early.
        Raises:
          ClusterError: a restarted instance did not become warm (HAProxy keeps it drained).
        """
        with self._lock:
            up = self._up_names()
            for inst in sorted(self.instances, key=lambda i: i.name in up):  # the down ones first
                if should_stop():
                    return
                t0 = time.monotonic()
                if inst.name not in up:
                    self.say(f"rolling restart: {inst.name} (port {inst.port}) is down: restarting it first")
                else:
                    if not self._up_names() - {inst.name}:
                        self.say(f"rolling restart: {inst.name} is the only instance up: requests fail until "
                                 "it is warm again")
                    self.say(f"rolling restart: {inst.name} (port {inst.port}) draining")
                    hx.set_state(self.admin_socket, BACKEND, inst.name, "drain")
                    self._wait_idle(inst, drain_timeout)
                if inst.proc is not None and inst.proc.poll() is None:
                    inst.proc.send_signal(signal.SIGTERM)
                    try:
                        inst.proc.wait(self.stop_timeout)
                    except subprocess.TimeoutExpired:
                        inst.proc.kill()
                        inst.proc.wait()
                self._spawn(inst)
                self._wait_warm(inst)
                hx.set_state(self.admin_socket, BACKEND, inst.name, "ready")
                self._wait_all_up([inst], 60.0)
                self.say(f"rolling restart: {inst.name} back up (pid {inst.proc.pid}, {time.monotonic() - t0:.0f} s)")
            self.rolling_restarts += 1
            self._write_state()

    def _up_names(self) -> set[str]:
        """The instances whose process runs and whose HAProxy check says UP."""
        stats = self.server_stats()
        return {i.name for i in self.instances
                if i.proc is not None and i.proc.poll() is None and stats.get(i.name, {}).get("status") == "UP"}

    def _wait_idle(self, inst: Instance, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if int(self.server_stats().get(inst.name, {}).get("scur") or 0) == 0:
                return
            time.sleep(0.1)
        self.say(f"rolling restart: {inst.name} still busy after {timeout:g} s, stopping it anyway")

    def _write_state(self) -> None:
        state = {"launcher_pid": os.getpid(), "url": self.url, "rolling_restarts": self.rolling_restarts,
                 "haproxy_pid": self.haproxy.pid if self.haproxy else None,
                 "instances": [{"name": i.name, "url": i.url, "pid": i.proc.pid if i.proc else None}
                               for i in self.instances]}
        tmp = self.run_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_path)

    def describe(self) -> str:
        """Where everything listens, for the terminal."""
        key = "X-Session-Id / user / client address" if self.balance == "hash" else "round robin"
        lines = [f"jaxinfer cluster: {len(self.instances)} instance(s) behind HAProxy ({key})",
                 f"  balancer  {self.url}  (OpenAI API at {self.url}/v1)"]
        lines += [f"  {i.name:<8}  {i.url}  pid {i.proc.pid}  metrics {i.url}/metrics  log {i.log_path}"
                  for i in self.instances]
        lines += [f"  haproxy   pid {self.haproxy.pid}  config {self.config_path}  admin socket {self.admin_socket}"
                  + (f"  stats http://{self.stats_bind}/stats" if self.stats_bind else ""),
                  f"Ctrl+C or SIGTERM stops everything; `python -m jaxinfer.cluster --rolling-restart --port "
                  f"{self.port}` restarts the instances one at a time."]
        return "\n".join(lines)


def default_run_dir(port: int) -> Path:
    """``<tmp>/jaxinfer-cluster-<port>``: where a launcher on ``port`` keeps its files."""
    return Path(tempfile.gettempdir()) / f"jaxinfer-cluster-{port}"


def _check_free(address: str) -> None:
    """Raise `ClusterError` unless ``host:port`` can be bound now (HAProxy binds it later)."""
    host, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as HAProxy does
        try:
            sock.bind((host.strip("[]"), int(port)))
        except OSError as e:
            raise ClusterError(f"cannot listen on {address}: {e.strerror or e}") from None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


# ----- command line ---------------------------------------------------------------------------


if __name__ == "__main__":  # the command line lives in jaxinfer.cluster.cli
    from jaxinfer.cluster.cli import main

    sys.exit(main())
