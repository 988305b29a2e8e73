"""jaxinfer.cluster.launcher: see docs/architecture.md."""
