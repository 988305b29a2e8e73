"""What a benchmark measured: software, checkpoint, machine and server state.

Collected without importing JAX (versions come from package metadata). The server side
(backend, dtype, device) cannot be asked over the OpenAI API, so the caller passes it as
``server_info`` (``compare.py`` knows what it launched; the CLI takes ``--server-info
key=value``); the client adds ``/v1/models`` and, when the server has one, a parse of
``/metrics`` (``jaxinfer_*`` gauges and counters such as ``kv_fragmentation_ratio``).
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def git_commit(repo: Path = REPO) -> dict:
    """``{"commit": sha or None, "dirty": bool}`` for the jaxinfer checkout."""
    try:
        sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=repo, text=True, stderr=subprocess.DEVNULL)
        status = subprocess.check_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, text=True)
        return {"commit": sha.strip(), "dirty": bool(status.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def checkpoint_hash(model: str, weights_dir: Path = REPO / "weights") -> dict | None:
    """The converted checkpoint's provenance (``weights/<model>/source.json``: source file,
    format, sha256 of the source files, digest), or None if there is none."""
    path = Path(model) / "source.json" if Path(model).is_dir() else Path(weights_dir) / model / "source.json"
    if not path.exists():
        return None
    src = json.loads(path.read_text())
    return {k: src.get(k) for k in ("digest", "sha256", "format", "note")}


def package_versions(names=("jaxinfer", "jax", "jaxlib", "numpy", "httpx", "transformers", "torch")) -> dict:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def host_info() -> dict:
    """The client machine (the same machine as the server in ``compare.py``)."""
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"hostname": platform.node(), "cpu": cpu, "cpu_count": os.cpu_count(), "memory_bytes": mem,
            "platform": platform.platform(), "python": platform.python_version()}


def parse_metrics(text: str, prefix: str = "jaxinfer_") -> dict:
    """Prometheus exposition text -> ``{name: value}`` for samples starting with ``prefix`` that carry
    no label but ``model_name`` (the served model, on every jaxinfer series)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(prefix) and set(s.labels) <= {"model_name"}:
                out[s.name[len(prefix):]] = s.value
    return out


def server_state(base_url: str, timeout_s: float = 10.0) -> dict:
    """``/v1/models`` and the ``jaxinfer_*`` metrics, each None where unavailable."""
    out = {"models": None, "metrics": None}
    with httpx.Client(base_url=base_url, timeout=timeout_s) as c:
        for key, path in (("models", "/v1/models"), ("metrics", "/metrics")):
            try:
                r = c.get(path)
                if r.status_code == 200:
                    out[key] = r.json() if key == "models" else parse_metrics(r.text)
            except (httpx.HTTPError, ValueError):
                pass
    return out


def collect(model: str, server_info: dict | None = None) -> dict:
    """Everything but the server's live state: time, git, checkpoint, versions, host."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "model": model, "checkpoint": checkpoint_hash(model), "git": git_commit(),
            "versions": package_versions(), "host": host_info(), "server": dict(server_info or {})}
