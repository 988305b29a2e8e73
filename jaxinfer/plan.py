"""``python -m jaxinfer.plan``: The memory planner (`jaxinfer.entrypoints.plan`); this module only keeps the command."""
import sys

from jaxinfer.entrypoints.plan import main

if __name__ == "__main__":
    sys.exit(main())
