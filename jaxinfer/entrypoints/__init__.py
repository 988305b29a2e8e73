"""The front doors: `llm` (the offline `LLM` API), `openai` (the OpenAI-compatible HTTP API
that ``server.py`` serves), `served_models` (which models one server runs), `plan` (the
memory planner, ``python -m jaxinfer.plan``) and `eval` (``python -m jaxinfer.eval``). They
build engines through `jaxinfer.engine.builder` and never import the runner or the layers.
"""
