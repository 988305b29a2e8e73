"""jaxinfer.entrypoints: see docs/architecture.md."""
