"""jaxinfer.tokenizer.tokenizer: see docs/architecture.md."""
