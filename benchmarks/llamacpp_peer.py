"""llama.cpp as the peer system of the serving comparison: build it, make an F16 GGUF, run its server.

Owns three things, each cached so the second call is instant:
  1. the source: llama.cpp as vendored in the ``llama-cpp-python`` sdist (version
     `LLAMA_CPP_PYTHON_VERSION`, fetched with ``pip download --no-deps --no-binary llama-cpp-python``,
     so one pinned llama.cpp commit and only PyPI as a source);
  2. a CPU build of ``llama-server`` and ``llama-quantize`` (CMake, Release, static,
     ``GGML_NATIVE=ON``, no CUDA, no web UI, no OpenSSL); about 10 minutes on 2 cores;
  3. ``<source>.F16.gguf``: the same GGUF jaxinfer converts (``weights/.download/``; the
     default model's Q4_1 file, or Gemma 3's Q4_K_M file, `source_gguf`), dequantized to
     float16 by ``llama-quantize --allow-requantize ... F16``, so both systems serve the
     same weights.
Everything lives under ``$LLAMACPP_HOME`` (default ``~/.cache/jaxinfer/llamacpp``).

`ensure_llamacpp` returns ``(llama-server, F16 gguf)`` or None with the reason printed
(no cmake / C++ compiler, ``pip download`` refused, a failed build): the comparison then
goes on without llama.cpp. `llama_server` starts the server on a free port for one
scenario (``-np`` slots = the scenario's clients, ``-c`` = slots x per-slot context,
continuous batching, ``--metrics``), waits for ``/health`` and stops it afterwards.
Requests to it should carry ``"cache_prompt": false`` (`REQUEST_EXTRA`): no prompt-prefix
reuse, like jaxinfer with ``--no-prefix-caching``.

CLI: ``python benchmarks/llamacpp_peer.py`` builds (if needed) and prints the two paths.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Callable, Iterator

import httpx

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SOURCE_GGUF = ROOT / "weights" / ".download" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_GGUFS = {"smollm2-135m-instruct": SOURCE_GGUF,
                "gemma3-270m": ROOT / "weights" / ".download" / "gemma-3-270m-q4_k_m.gguf"}
SERVED_NAME = "smollm2-135m-instruct"
REQUEST_EXTRA = {"cache_prompt": False}  # fields added to every request body sent to llama-server
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_CUDA=OFF",
               "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF")


class BuildError(RuntimeError):
    """A step of the llama.cpp build could not be done; the message says which and why."""


def home() -> Path:
    """The cache folder: ``$LLAMACPP_HOME`` or ``~/.cache/jaxinfer/llamacpp``."""
    return Path(os.environ.get("LLAMACPP_HOME") or Path.home() / ".cache" / "jaxinfer" / "llamacpp")


def source_gguf(model: str) -> Path:
    """The GGUF that jaxinfer's ``model`` is converted from (assembled first for Gemma 3).

    Raises:
      ValueError: ``model`` is not one of `SOURCE_GGUFS` (a local checkpoint has no GGUF).
    """
    if model not in SOURCE_GGUFS:
        raise ValueError(f"no GGUF known for model {model!r}; llama.cpp runs {sorted(SOURCE_GGUFS)}")
    if model == "gemma3-270m":
        from jaxinfer.weights.catalog import gemma3_gguf
        return gemma3_gguf(ROOT / "weights")
    return SOURCE_GGUFS[model]


def ensure_llamacpp(root: Path | None = None, source_gguf: Path = SOURCE_GGUF, jobs: int | None = None,
                    log: Callable[[str], None] = print) -> tuple[Path, Path] | None:
    """Build llama.cpp's server and the F16 GGUF if they are not cached yet.

    Args:
      root: cache folder (default `home`).
      source_gguf: the GGUF jaxinfer's model comes from (`source_gguf`).
      jobs: parallel compile jobs (default: CPU count).
      log: where progress lines and the reason for a failure go.

    Returns:
      ``(path of llama-server, path of the F16 GGUF)``, or None when any step failed (the
      reason has been passed to ``log``; the build log is ``<root>/build.log``).
    """
    root = Path(root or home())
    try:
        root.mkdir(parents=True, exist_ok=True)
        server, quantize = build_binaries(root, jobs or os.cpu_count() or 1, log)
        return server, f16_gguf(quantize, source_gguf, root, jobs or os.cpu_count() or 1, log)
    except (BuildError, OSError) as exc:
        log(f"llama.cpp unavailable, continuing without it: {exc}")
        return None


def build_binaries(root: Path, jobs: int, log: Callable[[str], None]) -> tuple[Path, Path]:
    """``(llama-server, llama-quantize)`` under ``root/llama.cpp/build/bin``, built if missing.

    Raises:
      BuildError: no cmake or C++ compiler, the sdist could not be fetched, or the build failed.
    """
    bindir = root / "llama.cpp" / "build" / "bin"
    server, quantize = bindir / "llama-server", bindir / "llama-quantize"
    if server.is_file() and quantize.is_file():
        return server, quantize
    missing = [t for t in ("cmake",) if not shutil.which(t)] + (
        [] if any(shutil.which(c) for c in ("c++", "g++", "clang++")) else ["a C++ compiler"])
    if missing:
        raise BuildError(f"missing {', '.join(missing)}")
    src = fetch_source(root, log)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    log(f"building llama.cpp ({jobs} jobs; about 10 minutes on 2 cores; log: {root / 'build.log'})")
    _run(["cmake", "-S", str(src), "-B", str(src / "build"), *generator, *CMAKE_FLAGS], root / "build.log")
    _run(["cmake", "--build", str(src / "build"), "--config", "Release", "-j", str(jobs),
          "--target", "llama-server", "llama-quantize"], root / "build.log")
    if not (server.is_file() and quantize.is_file()):
        raise BuildError(f"the build finished without {server} / {quantize}")
    return server, quantize


def fetch_source(root: Path, log: Callable[[str], None]) -> Path:
    """``root/llama.cpp``: the llama.cpp tree vendored in the pinned llama-cpp-python sdist.

    Raises:
      BuildError: ``pip download`` failed (no network, index refused) or the sdist has no
        ``vendor/llama.cpp``.
    """
    dest = root / "llama.cpp"
    if (dest / "CMakeLists.txt").is_file():
        return dest
    dl = root / "sdist"
    log(f"fetching llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist (its vendored llama.cpp)")
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python", "-d", str(dl),
          f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"], root / "build.log")
    sdists = sorted(dl.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
    if not sdists:
        raise BuildError(f"pip download left no llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz in {dl}")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = root / "llama.cpp.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdists[0]) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and (m.isfile() or m.isdir())]
        if not members:
            raise BuildError(f"{sdists[0].name} has no vendor/llama.cpp")
        for m in members:
            m.name = m.name[len(prefix):] or "."
        tar.extractall(tmp, members=members, filter="data")
    tmp.rename(dest)
    return dest


def f16_gguf(quantize: Path, source: Path, root: Path, jobs: int, log: Callable[[str], None],
             weight_type: str = "F16") -> Path:
    """``root/<source stem>.<weight_type>.gguf``: ``source`` requantized by ``llama-quantize`` to
    ``weight_type`` (F16: dequantized to float16; Q8_0: int8 with a float16 scale per 32
    weights), made if missing.

    Raises:
      BuildError: ``source`` is missing or ``llama-quantize`` failed.
    """
    out = root / f"{source.stem}.{weight_type}.gguf"
    if out.is_file():
        return out
    if not source.is_file():
        raise BuildError(f"{source} is missing (run `python -m jaxinfer.convert` first)")
    log(f"writing {out.name} with llama-quantize")
    part = out.with_suffix(".partial")
    _run([str(quantize), "--allow-requantize", str(source), str(part), weight_type, str(jobs)], root / "build.log")
    part.rename(out)
    return out


def q8_0_gguf(source_gguf: Path = SOURCE_GGUF, root: Path | None = None, log: Callable[[str], None] = print
              ) -> Path | None:
    """The Q8_0 GGUF of ``source_gguf`` (`f16_gguf` with ``weight_type="Q8_0"``), for the peer of
    jaxinfer's ``--quantization int8``; None (reason logged) when llama.cpp is not built yet
    (`ensure_llamacpp` first) or the requantization failed."""
    root = Path(root or home())
    quantize = root / "llama.cpp" / "build" / "bin" / "llama-quantize"
    if not quantize.is_file():
        log(f"no {quantize}: build llama.cpp first")
        return None
    try:
        return f16_gguf(quantize, source_gguf, root, os.cpu_count() or 1, log, "Q8_0")
    except (BuildError, OSError) as exc:
        log(f"no Q8_0 GGUF: {exc}")
        return None


def _run(cmd: list[str], log_path: Path) -> None:
    """Run ``cmd`` appending its output to ``log_path``; BuildError (with the log's tail) on failure."""
    with open(log_path, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
        except OSError as exc:
            raise BuildError(f"{cmd[0]}: {exc}") from exc
    if rc != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-5:]
        raise BuildError(f"`{' '.join(cmd[:4])} ...` exited with {rc}: " + " | ".join(tail))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(server: Path, gguf: Path, port: int, parallel: int, ctx_per_slot: int,
                   threads: int | None = None, served_name: str = SERVED_NAME) -> list[str]:
    """The ``llama-server`` command line of one scenario.

    Args:
      parallel: slots (``-np``): requests decoded together, llama.cpp's continuous batch;
        set to the scenario's clients.
      ctx_per_slot: tokens of context per slot; ``-c`` is ``parallel * ctx_per_slot`` (the
        server splits its context evenly over the slots).
      threads: CPU threads for generation and batch processing (default: CPU count).
    """
    threads = threads or os.cpu_count() or 1
    return [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(parallel), "-c", str(parallel * ctx_per_slot), "-t", str(threads), "-tb", str(threads),
            "--cont-batching", "--no-webui", "--metrics", "-a", served_name]


@contextlib.contextmanager
def llama_server(server: Path, gguf: Path, parallel: int, ctx_per_slot: int, threads: int | None = None,
                 log_path: Path | None = None, startup_timeout_s: float = 300.0) -> Iterator[str]:
    """Run ``llama-server`` for the ``with`` block; yields its base URL (``http://127.0.0.1:<port>``).

    Waits until ``GET /health`` answers 200 (the model is loaded); on exit sends SIGTERM and,
    after 30 s, SIGKILL. Arguments as in `server_command`; ``log_path`` gets its output.

    Raises:
      RuntimeError: the server exited during start-up.
      TimeoutError: not healthy within ``startup_timeout_s``.
    """
    cmd = server_command(server, gguf, free_port(), parallel, ctx_per_slot, threads)
    with running(cmd, log_path, startup_timeout_s) as url:
        yield url


@contextlib.contextmanager
def running(cmd: list[str], log_path: Path | None, startup_timeout_s: float) -> Iterator[str]:
    """Start the server ``cmd`` (which has ``--port P``), wait for ``/health``, yield
    ``http://127.0.0.1:P``; SIGTERM it afterwards (SIGKILL after 30 s)."""
    url = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path or os.devnull, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(url, proc, startup_timeout_s)
            yield url
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float) -> float:
    """Seconds until ``url/health`` answered 200.

    Raises:
      RuntimeError: ``proc`` exited first.
      TimeoutError: ``timeout_s`` passed.
    """
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as c:
        while time.monotonic() - t0 < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with status {proc.returncode} during start-up")
            with contextlib.suppress(httpx.HTTPError):
                if c.get(url + "/health").status_code == 200:
                    return time.monotonic() - t0
            time.sleep(0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s:g} s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--home", type=Path, default=None, help="cache folder (default $LLAMACPP_HOME or "
                   "~/.cache/jaxinfer/llamacpp)")
    p.add_argument("--jobs", type=int, default=None, help="compile jobs (default: CPU count)")
    a = p.parse_args(argv)
    built = ensure_llamacpp(a.home, jobs=a.jobs)
    if built is None:
        return 1
    print(f"llama-server: {built[0]}\nF16 GGUF: {built[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
