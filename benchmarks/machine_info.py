"""The machine a benchmark runs on: `device_label` (the suffix of results folders), `gpu_info`
(nvidia-smi) and `cpu_busy_fraction` (how busy other work keeps the CPU, from ``/proc/stat``).

Split from `compare.py` so the other benchmarks (soak, cluster, prefix cache) name their
results without importing the serving comparison. Plain Python; no JAX import.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


def device_label() -> str:
    """``<gpu-name>`` from nvidia-smi, else ``cpu<cores>``."""
    gpu = gpu_info()
    return gpu["name"].lower().replace(" ", "-") if gpu else f"cpu{os.cpu_count()}"


def gpu_info() -> dict | None:
    """The first GPU's name and memory (MiB) from nvidia-smi, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        line = subprocess.check_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                       text=True).splitlines()[0]
        name, mem = (x.strip() for x in line.split(","))
        return {"name": name, "memory_mib": int(mem)}
    except (subprocess.CalledProcessError, OSError, ValueError, IndexError):
        return None


def cpu_busy_fraction(interval_s: float = 1.0) -> float | None:
    """Share of all CPU time (0-1) that was not idle over the next ``interval_s`` seconds,
    from ``/proc/stat`` (idle + iowait count as idle); None where there is no ``/proc/stat``."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]  # total (without guest, already in user), idle + iowait

    try:
        t0, i0 = sample()
        time.sleep(interval_s)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / (t1 - t0) if t1 > t0 else None
