"""The HAProxy binary and its runtime API, as the cluster launcher (`jaxinfer.cluster.launcher`) uses them.

Owns: finding ``haproxy`` (and installing it with the system package manager when it is
missing), checking a configuration file, and the admin socket's commands (``set server
... state drain|ready``, ``show stat``), whose line protocol is described in HAProxy's
management guide (https://docs.haproxy.org/2.6/management.html, section 9.3).
"""
from __future__ import annotations

import csv
import io
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Callable

# (package manager, install command): the first one present is used
INSTALLERS = (("apt-get", ["apt-get", "install", "-y", "haproxy"]),
              ("dnf", ["dnf", "install", "-y", "haproxy"]),
              ("yum", ["yum", "install", "-y", "haproxy"]),
              ("apk", ["apk", "add", "haproxy"]),
              ("brew", ["brew", "install", "haproxy"]))
_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])


class HAProxyError(RuntimeError):
    """HAProxy is missing and could not be installed, refused a configuration, or its admin
    socket answered an error."""


def find_haproxy() -> str | None:
    """Path of the ``haproxy`` executable (``PATH`` and the usual ``sbin`` folders), or None."""
    return shutil.which("haproxy", path=_SEARCH)


def ensure_haproxy(say: Callable[[str], None] = print) -> str:
    """``haproxy``'s path, installing the package first if it is missing (and saying so).

    Uses the first of apt-get, dnf, yum, apk and brew that exists, through ``sudo -n`` when
    not root (apt-get runs ``apt-get update`` once if the first install fails).

    Raises:
      HAProxyError: no package manager, or the install failed; the message says what to run.
    """
    found = find_haproxy()
    if found:
        return found
    manual = "install it yourself (Debian/Ubuntu: sudo apt-get install -y haproxy) and try again"
    manager = next(((name, cmd) for name, cmd in INSTALLERS if shutil.which(name)), None)
    if manager is None:
        raise HAProxyError(f"haproxy is not installed and no known package manager was found: {manual}")
    name, cmd = manager
    prefix = [] if name == "brew" or os.geteuid() == 0 else ["sudo", "-n"]
    if prefix and not shutil.which("sudo"):
        raise HAProxyError(f"haproxy is not installed, and installing it needs root: {manual}")
    say(f"haproxy not found: installing it with {' '.join(prefix + cmd)}")
    attempts = [prefix + cmd] if name != "apt-get" else [prefix + cmd, prefix + ["apt-get", "update"], prefix + cmd]
    result = None
    for attempt in attempts:
        result = subprocess.run(attempt, capture_output=True, text=True, env={**os.environ,
                                                                                "DEBIAN_FRONTEND": "noninteractive"})
        if result.returncode == 0 and attempt[-1] == "haproxy" and find_haproxy():
            return find_haproxy()
    tail = (result.stderr or result.stdout).strip().splitlines()[-3:] if result else []
    raise HAProxyError(f"could not install haproxy with {name} ({' / '.join(tail)}): {manual}")


def check_config(binary: str, path: str | Path) -> None:
    """Validate a configuration file with ``haproxy -c``.

    Raises:
      HAProxyError: HAProxy's own complaint.
    """
    result = subprocess.run([binary, "-c", "-f", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        raise HAProxyError(f"haproxy refused {path}: {(result.stderr or result.stdout).strip()}")


def admin(socket_path: str | Path, command: str, timeout: float = 5.0) -> str:
    """Send one runtime-API command and return the answer (text, possibly empty).

    Raises:
      OSError: the socket cannot be reached.
      HAProxyError: the answer is an error (unknown server, no permission, ...).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(socket_path))
        sock.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks).decode()
    if any(word in answer for word in ("Unknown command", "No such", "Permission denied", "Require")):
        raise HAProxyError(f"haproxy refused {command!r}: {answer.strip()}")
    return answer


def server_stats(socket_path: str | Path, backend: str) -> dict[str, dict[str, str]]:
    """``show stat`` for the servers of one backend: {server name: {column: value}}.

    Useful columns: ``status`` (``UP``, ``DOWN``, ``DRAIN``, ``MAINT``, ``UP 1/2`` while
    rising...), ``scur`` (requests being served now), ``stot`` (requests so far).
    """
    text = admin(socket_path, "show stat").lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {row["svname"]: row for row in rows
            if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND")}


def set_state(socket_path: str | Path, backend: str, server: str, state: str) -> None:
    """``set server <backend>/<server> state <state>``: ``drain`` (no new requests, those in
    flight finish), ``ready`` or ``maint``.

    Raises:
      HAProxyError: unknown server or state.
    """
    if state not in ("ready", "drain", "maint"):
        raise ValueError(f"state must be ready, drain or maint, got {state!r}")
    answer = admin(socket_path, f"set server {backend}/{server} state {state}")
    if answer.strip():
        raise HAProxyError(f"haproxy refused to set {backend}/{server} to {state}: {answer.strip()}")
