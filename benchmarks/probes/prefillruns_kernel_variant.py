"""Other versions of the attention kernel (jaxinfer/kernels/cpu/csrc/paged_decode.cc) registered beside this
checkout's under their own FFI targets, for the prefillruns_* A/B probes: `register_source` builds
a given source text, `register_at` the kernel of a git revision. A probe then traces with
``native_attention.TARGET`` set to the returned name."""
import logging
import subprocess
from pathlib import Path

from jaxinfer.kernels.cpu import attention as native_attention
from jaxinfer.kernels.cpu import build as native_build

ROOT = Path(__file__).resolve().parents[2]


def register_source(text: str, name: str) -> str:
    """Builds and registers ``text`` as target ``pa_<name>``; returns the target name."""
    assert native_attention.available()  # this checkout's kernel first, under its own target
    source = native_attention.SOURCE.parent / f"_probe_{name}.cc"  # beside the headers it includes
    source.write_text(text)
    try:
        why = native_build.register(source, name, "JAXINFER_NATIVE_AMX", {f"pa_{name}": "JaxinferPagedDecode"},
                                    logging.getLogger("probe"))
    finally:
        source.unlink()
    assert why is None, why
    return f"pa_{name}"


def register_at(rev: str) -> str:
    """The kernel of git revision ``rev`` of this repository, registered (`register_source`)."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:jaxinfer/kernels/cpu/csrc/paged_decode.cc"],
                          capture_output=True, text=True, check=True).stdout
    return register_source(text, "old")
