"""Building and loading the C++ sources under ``jaxinfer/kernels/cpu/csrc/`` as XLA FFI libraries.

Owns the compiler choice, the build and its cache. A source is compiled on first use with
the machine's C++ compiler (``$CXX``, else ``g++``/``c++``/``clang++``) against the XLA FFI
headers that jaxlib ships (`jax.ffi.include_dir`), ``-O3 -march=native``, into
``~/.cache/jaxinfer/native/<stem>-<hash>.so`` (``$JAXINFER_NATIVE_DIR`` overrides the
folder); the hash covers the source and the folder's headers, the flags, the compiler, JAX's version and the CPU's
feature flags. `load_ffi` is the one loader every kernel binding uses (`jaxinfer.kernels.cpu.attention`,
`jaxinfer.kernels.cpu.gemv`, `jaxinfer.kernels.cpu.argmax`, `jaxinfer.kernels.cpu.amx`, `jaxinfer.kernels.cpu.int8`):
the ``JAXINFER_NATIVE_*`` switch, the compiler, the cached build and the registration of its XLA
FFI targets for CPU. It imports nothing else of jaxinfer: the CPU's flags come in as an
argument (`jaxinfer.platform.cpu_features.host_cpu_flags` where the caller has them; else read here, the
same ``flags`` line, for the cache key only).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import numpy as np

NATIVE_DIR = Path(__file__).parent / "csrc"
# -ffast-math's reassociation (what vectorizes the sums), spelled out without -ffast-math itself:
# with it, the linker adds crtfastmath.o, whose constructor sets flush-to-zero and
# denormals-are-zero for the whole process on load (numpy's and JAX's subnormals became 0).
# Infinities and NaNs keep their meaning (no -ffinite-math-only).
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-signed-zeros", "-fno-trapping-math", "-fassociative-math",
         "-freciprocal-math", "-fopenmp-simd", "-shared", "-fPIC", "-std=c++17", "-w")


def compiler() -> str | None:
    """The C++ compiler to use (``$CXX`` if set and found), or None."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return next((p for p in map(shutil.which, ("g++", "c++", "clang++")) if p), None)


def _read_cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first ``flags`` (x86) or ``Features`` (Arm) line of ``/proc/cpuinfo``, for the cache
    key only (empty where unreadable); callers that have `jaxinfer.platform.cpu_features.host_cpu_flags`
    pass those instead."""
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _cpu_key(cpu_flags: frozenset[str] | None) -> str:
    flags = _read_cpu_flags() if cpu_flags is None else cpu_flags
    return " ".join(sorted(flags)) if flags else platform.processor()


def library_path(source: Path, cxx: str, cpu_flags: frozenset[str] | None = None) -> Path:
    """Where the build of ``source`` by ``cxx`` for a CPU with ``cpu_flags`` (None: this host's) is cached."""
    key = hashlib.sha256()
    headers = [h.read_bytes() for h in sorted(NATIVE_DIR.glob("*.h"))]  # included by the sources
    for part in (source.read_bytes(), *headers, " ".join(FLAGS).encode(), cxx.encode(), jax.__version__.encode(),
                 _cpu_key(cpu_flags).encode()):
        key.update(part)
    folder = Path(os.environ.get("JAXINFER_NATIVE_DIR", Path.home() / ".cache" / "jaxinfer" / "native"))
    return folder / f"{source.stem}-{key.hexdigest()[:16]}.so"


def _build(cxx: str, source: Path, out: Path) -> None:
    """Compile to a temporary name and rename, so concurrent builders never see half a file.

    Raises:
      RuntimeError: the compiler failed (its stderr is in the message).
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", str(source), "-o", tmp]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    os.replace(tmp, out)


def load(source: Path, cxx: str, what: str, logger, cpu_flags: frozenset[str] | None = None) -> ctypes.CDLL:
    """``source`` built once per machine (logged as building ``what``) and loaded.

    Raises:
      OSError: the library could not be loaded.
      RuntimeError: the compiler failed.
    """
    path = library_path(source, cxx, cpu_flags)
    if not path.exists():
        logger.info("building the %s: %s", what, path)
        _build(cxx, source, path)
    return ctypes.cdll.LoadLibrary(str(path))


def load_ffi(source: str | Path, targets: dict[str, str], *, what: str, env_switch: str, logger,
             cpu_flags: frozenset[str] | None = None) -> str | None:
    """Build (once per machine) and load a C++ source and register its FFI handlers for CPU.

    Args:
      source: a stem of ``jaxinfer/kernels/cpu/csrc/`` ("argmax" is ``argmax.cc``), or a path.
      targets: XLA custom-call target name -> the library's exported handler symbol.
      what: the kernel's name in log lines and reasons.
      env_switch: the ``JAXINFER_NATIVE_*`` variable; "0" turns the kernel off (read here only).
      logger: where the build is logged.
      cpu_flags: the CPU's feature flags for the cache key (None: read from ``/proc/cpuinfo``).

    Returns:
      None once every target is registered, else why not (the switch is "0", no compiler, or the
      build or load failed), for the caller to fall back to XLA's own ops. Nothing is raised.
    """
    source = NATIVE_DIR / f"{source}.cc" if isinstance(source, str) else source
    if os.environ.get(env_switch, "1") == "0":
        return f"{env_switch}=0"
    cxx = compiler()
    if cxx is None:
        return "no C++ compiler found ($CXX, g++, c++, clang++)"
    try:
        lib = load(source, cxx, what, logger, cpu_flags)
        for target, symbol in targets.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
    except (OSError, RuntimeError, AttributeError) as err:
        return f"the {what} did not build or load: {err}"
    return None


def register(source: Path, what: str, env_switch: str, targets: dict[str, str], logger) -> str | None:
    """`load_ffi` with positional arguments (the tests' and the benchmark probes' form)."""
    return load_ffi(source, targets, what=what, env_switch=env_switch, logger=logger)


def first_call(what: str, call, want: float) -> str | None:
    """Run ``call()`` (a small product through a freshly registered kernel) and check that every
    element of its result is ``want``; None, or why the kernel cannot be used. A compiler without
    the CPU's intrinsics (GCC before 10 lacks AVX-512 BF16) builds a library whose calls return
    an error, which would otherwise surface in a model step."""
    try:
        y = np.asarray(call())
        if not np.allclose(y, want):
            return f"the {what} computed {y.ravel()[:4]}... instead of {want:g}s"
    except Exception as err:  # noqa: BLE001 (the FFI reports as XlaRuntimeError or others)
        return f"the {what} failed a first call: {str(err).splitlines()[0]}"
    return None
