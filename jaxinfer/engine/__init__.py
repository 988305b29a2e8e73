"""jaxinfer.engine.llm_engine: see docs/architecture.md."""
