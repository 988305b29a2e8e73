"""Checkpoints: `catalog` (the built-in models and model names to folders), `checkpoint` (the
orbax ``params/`` folder), `convert` (GGUF or Hugging Face -> a jaxinfer folder,
``python -m jaxinfer.convert``) and `sources` (reading the two source formats).
"""
