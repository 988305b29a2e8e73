"""jaxinfer.layers.quantization: see docs/architecture.md."""
