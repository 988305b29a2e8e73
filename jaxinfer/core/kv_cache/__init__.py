"""jaxinfer.core.kv_cache: see docs/architecture.md."""
