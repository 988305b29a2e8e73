"""jaxinfer.kernels: see docs/architecture.md."""
