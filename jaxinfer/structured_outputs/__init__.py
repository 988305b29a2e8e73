"""jaxinfer.structured_outputs.params: see docs/architecture.md."""
