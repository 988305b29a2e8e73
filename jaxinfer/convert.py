"""``python -m jaxinfer.convert``: Checkpoint conversion (`jaxinfer.weights.convert`); this module only keeps the command."""
import sys

from jaxinfer.weights.convert import main

if __name__ == "__main__":
    main()
