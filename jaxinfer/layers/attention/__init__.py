"""Paged attention for the model step: the backend registry (`registry`), one module per
backend (`xla`, `pallas`), their interface (`base`), the KV cache's storage (`kv_storage`) and
the online-softmax pieces the backends share (`softmax`).

Importing this package imports no JAX (`jaxinfer.config` reads `registry.ATTENTION_BACKENDS`).
"""
