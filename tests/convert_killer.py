"""``python tests/convert_killer.py POINT SRC OUT``: a conversion that SIGKILLs itself at POINT.

Not a test module: a subprocess target for tests/test_crash_safe_convert.py, so the kill is
a real one (no ``finally`` runs, no clean-up). POINT is
  * ``params``: half-way through writing the parameter checkpoint (half of the tree written);
  * ``publish``: with ``--force`` over an existing conversion, after that one was moved aside
    and before the new folder is renamed into place.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from jaxinfer.weights import convert  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    point, src, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if point == "params":
        real = convert.save_params

        def half_then_die(path, tree):
            layers = tree["layers"]
            real(path, {"layers": layers})  # a real orbax write of part of the tree
            die()

        convert.save_params = half_then_die
    elif point == "publish":
        convert._publish = lambda tmp, dest: die()
    else:
        raise SystemExit(f"unknown kill point {point!r}")
    convert.convert(src, out, force=point == "publish")
    raise SystemExit("the conversion finished: the kill point was never reached")


if __name__ == "__main__":
    main()
