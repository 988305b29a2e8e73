"""jaxinfer.core: see docs/architecture.md."""
