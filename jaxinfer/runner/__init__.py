"""jaxinfer.runner: see docs/architecture.md."""
