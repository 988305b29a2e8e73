"""``python -m jaxinfer.cluster --instances N [server flags]`` (`jaxinfer.cluster.cli`)."""
import sys

from jaxinfer.cluster.cli import main

sys.exit(main())
