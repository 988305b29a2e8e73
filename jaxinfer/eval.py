"""``python -m jaxinfer.eval``: Model quality measured through the engine (`jaxinfer.entrypoints.eval`); this module only keeps the command."""
import sys

from jaxinfer.entrypoints.eval import main

if __name__ == "__main__":
    sys.exit(main())
