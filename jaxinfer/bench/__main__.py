"""``python -m jaxinfer.bench serve [flags]``: see `jaxinfer.bench.serve`."""
import sys

from jaxinfer.bench import serve


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] != "serve":
        sys.exit("usage: python -m jaxinfer.bench serve [--help | flags]")
    serve.main(sys.argv[2:])


if __name__ == "__main__":
    main()
