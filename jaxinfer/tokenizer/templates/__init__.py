"""Chat templates shipped with jaxinfer, and `load_chat_template` (the ``--chat-template`` option).

Owns the bundled templates (``<name>.jinja`` files next to this module, installed as
package data) and the rule that turns the option's value into template text, as vLLM's
``--chat-template``: a file path, a bundled name, or the template itself inline.

Bundled:
  * ``gemma3``: the standard Gemma 3 chat template, as published with the instruction-tuned
    Gemma 3 checkpoints. It writes ``<bos>`` itself, names the assistant ``model``, ends every
    turn with ``<end_of_turn>`` and folds a leading system message into the first user turn
    (Gemma 3 has no system role).

Plain Python: no JAX here.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled_names() -> list[str]:
    """Names of the bundled templates (file stems of ``jaxinfer/tokenizer/templates/*.jinja``), sorted."""
    return sorted(p.name.removesuffix(".jinja") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".jinja"))


def load_chat_template(spec: str | Path) -> str:
    """The Jinja text of a ``--chat-template`` value.

    Tried in order: an existing file (read as UTF-8); a bundled name (`bundled_names`, e.g.
    ``"gemma3"``); text that holds Jinja markup (``{{`` or ``{%``), used as the template itself.

    Raises:
      ValueError: none of these (names the bundled templates), or an empty file.
    """
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError(f"chat template file {spec!r} is empty")
        return text
    if spec in bundled_names():
        return resources.files(__name__).joinpath(f"{spec}.jinja").read_text(encoding="utf-8")
    if "{{" in spec or "{%" in spec:
        return spec
    raise ValueError(f"--chat-template {spec!r} is neither a file, nor a bundled template "
                     f"({', '.join(bundled_names())}), nor Jinja template text")
