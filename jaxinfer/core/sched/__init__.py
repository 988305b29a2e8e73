"""jaxinfer.core.sched: see docs/architecture.md."""
