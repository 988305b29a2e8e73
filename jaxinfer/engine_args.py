"""The engine's flags, spelled once: sizes (`parse_bytes`) and the flag table.

Owns `parse_bytes`, the one reading of a memory size on every command line
(``server.py``, ``python -m jaxinfer.plan``, the cluster launcher through ``server.py``).
Plain Python: no JAX import.
"""
from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


class SizeError(ValueError, argparse.ArgumentTypeError):
    """Not a memory size. A `ValueError`, and argparse's `ArgumentTypeError` so that a flag
    typed with `parse_bytes` fails with this message."""


def parse_bytes(text: str) -> int:
    """A memory size in bytes, in powers of 1024: ``"GB"``, ``"GiB"`` and ``"G"`` all mean
    2**30 (so ``"80GB"`` is 80 * 2**30 = 85,899,345,920 bytes), likewise k, M and T; a plain
    number is bytes. ``"2GiB"``, ``"512M"``, ``"1.5 MiB"``, ``"1073741824"``.

    Args:
      text: a number (decimals allowed) and an optional unit k/M/G/T, each optionally
        followed by ``i`` and then ``B`` (case-insensitive).
    Returns:
      The size in bytes (int, rounded down).
    Raises:
      SizeError: ``text`` is not such a size (a ValueError and an argparse.ArgumentTypeError).
    """
    m = _SIZE.match(text)
    if not m:
        raise SizeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1073741824)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))
