"""The command line of `jaxinfer.cluster.launcher`: ``python -m jaxinfer.cluster --instances N [server flags]``.

Owns the flags (the launcher's own; every other one is checked with ``server.py``'s parser,
built from `jaxinfer.config.args.FLAGS`, and passed to each instance), the foreground loop that watches the children and runs a
rolling restart on SIGHUP, and ``--rolling-restart``, which signals a running launcher (found
through its ``state.json``) and waits until it reports the restart done. The processes
themselves are `jaxinfer.cluster.launcher.Cluster`'s.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from jaxinfer.cluster import haproxy_runtime as hx
from jaxinfer.cluster.launcher import SERVER_SCRIPT, Cluster, ClusterError, default_run_dir
from jaxinfer.config.args import HelpFormatter, flag
from jaxinfer.cluster.haproxy_config import BALANCES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxinfer.cluster", formatter_class=HelpFormatter,
                                description="N jaxinfer servers on loopback ports behind HAProxy (consistent "
                                            "hashing, health checks on /health); docs/deploy.md.",
                                epilog="Every other flag is passed to each server.py (see python server.py --help).")
    p.add_argument("--instances", type=int, default=3, help="servers to start")
    # the balancer takes server.py's --host / --port defaults (jaxinfer.config.args); the instances get loopback ports
    p.add_argument("--host", default=flag("host").default, help="address HAProxy listens on")
    p.add_argument("--port", type=flag("port").type, default=flag("port").default, help="port HAProxy listens on")
    p.add_argument("--base-port", type=int, default=None, help="first instance's port (default: --port + 1)")
    p.add_argument("--balance", default="hash", choices=BALANCES,
                   help="hash: consistent hashing on X-Session-Id / user / client address; roundrobin: baseline")
    p.add_argument("--run-dir", default=None,
                   help="configuration, logs, admin socket and state (default: <tmp>/jaxinfer-cluster-<port>)")
    p.add_argument("--rolling-restart", action="store_true",
                   help="do not start a cluster: restart the instances of the one running on --port, one at a time")
    p.add_argument("--timeout", type=float, default=3600.0, help="--rolling-restart: seconds to wait for it")
    p.add_argument("--stats", default=None, metavar="HOST:PORT",
                   help="also serve HAProxy's stats page (/stats) and its Prometheus metrics (/metrics) there "
                        "(default: none)")
    return p


def check_server_flags(server_args: list[str]) -> None:
    """Parse the pass-through flags with ``server.py``'s own parser, so a typo exits 2 before
    anything starts (argparse prints the error)."""
    spec = importlib.util.spec_from_file_location("jaxinfer_server_cli", SERVER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = module.build_parser()
    parser.prog = "python -m jaxinfer.cluster [cluster flags]"
    parser.print_usage = lambda file=None: None  # the error line alone (server.py's usage is ~50 lines)
    module.check_flags(parser, parser.parse_args(server_args))


def request_rolling_restart(run_dir: Path, timeout: float) -> int:
    """Signal the launcher whose state is in ``run_dir`` (SIGHUP) and wait until it reports the
    restart done. Returns the exit status (0 done, 1 no launcher / it died / timed out)."""
    state_file = run_dir / "state.json"
    try:
        state = json.loads(state_file.read_text())
        os.kill(state["launcher_pid"], signal.SIGHUP)
    except (OSError, ValueError, KeyError) as e:
        print(f"no running cluster found in {run_dir} ({e})", file=sys.stderr)
        return 1
    done, pid = state["rolling_restarts"], state["launcher_pid"]
    print(f"rolling restart of {state['url']} requested (launcher pid {pid}); its progress is on its output")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
            if json.loads(state_file.read_text())["rolling_restarts"] > done:
                print(f"rolling restart done in {time.monotonic() - t0:.0f} s")
                return 0
        except ProcessLookupError:
            print("the launcher exited before the restart finished", file=sys.stderr)
            return 1
        except (OSError, ValueError):
            pass  # state file being replaced
    print(f"rolling restart not finished after {timeout:g} s", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, server_args = parser.parse_known_args(argv)
    run_dir = Path(args.run_dir or default_run_dir(args.port))
    if args.rolling_restart:
        return request_rolling_restart(run_dir, args.timeout)
    check_server_flags(server_args)
    try:
        cluster = Cluster(args.instances, server_args, host=args.host, port=args.port, base_port=args.base_port,
                          run_dir=run_dir, balance=args.balance, say=lambda m: print(m, flush=True),
                          stats_bind=args.stats)
    except ValueError as e:
        parser.error(str(e))
    signal.signal(signal.SIGTERM, _interrupt)  # while starting, SIGTERM is Ctrl+C: start() stops what it began
    try:
        cluster.start()
    except (ClusterError, hx.HAProxyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted while starting; stopped", file=sys.stderr)
        return 130
    stop, restart = threading.Event(), threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: restart.set())
    print(cluster.describe(), flush=True)
    return _serve(cluster, stop, restart)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def _serve(cluster: Cluster, stop: threading.Event, restart: threading.Event) -> int:
    """Watch the children until asked to stop; run rolling restarts on request."""
    reported: set[str] = set()
    status = 0
    while not stop.wait(0.5):
        if restart.is_set():
            restart.clear()
            try:
                cluster.rolling_restart(should_stop=stop.is_set)
                print("rolling restart done", flush=True)
            except (ClusterError, hx.HAProxyError, OSError) as e:
                print(f"rolling restart failed: {e}", file=sys.stderr, flush=True)
        if cluster.haproxy.poll() is not None:
            print(f"haproxy exited (status {cluster.haproxy.returncode}); stopping", file=sys.stderr)
            status = 1
            break
        for inst in cluster.instances:
            if inst.proc.poll() is not None and inst.name not in reported:
                reported.add(inst.name)
                print(f"{inst.name} exited (status {inst.proc.returncode}); HAProxy routes around it. "
                      f"Log: {inst.log_path}", file=sys.stderr, flush=True)
            elif inst.proc.poll() is None:
                reported.discard(inst.name)
    print("stopping: HAProxy finishes open connections, instances drain", flush=True)
    cluster.stop()
    print("stopped", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
