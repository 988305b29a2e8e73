"""jaxinfer.distributed.multihost: see docs/architecture.md."""
