"""``python -m jaxinfer.bench {serve} [flags]``: the benchmark tools' command line.

``serve``: load a running OpenAI-compatible server (`jaxinfer.bench.serve`). ``--help`` at
either level prints the help and exits 0.
"""
from __future__ import annotations

import argparse
import sys

from jaxinfer.bench import serve


def build_parser() -> argparse.ArgumentParser:
    """``python -m jaxinfer.bench`` with one sub-parser per tool."""
    p = argparse.ArgumentParser(prog="python -m jaxinfer.bench",
                                description="Benchmarks of an OpenAI-compatible inference server.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{serve}")
    serve.add_arguments(sub.add_parser(
        "serve", help="benchmark a running server (TTFT, TPOT, ITL, E2EL, throughput, goodput)",
        description=serve.__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter))
    return p


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        serve.prompt_format(args)
    except ValueError as exc:
        parser.error(str(exc))
    serve.run_cli(args)


if __name__ == "__main__":
    main()
