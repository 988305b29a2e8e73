"""jaxinfer.kernels.cpu: see docs/architecture.md."""
