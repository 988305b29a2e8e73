"""jaxinfer.weights.catalog: see docs/architecture.md."""
