"""The ``input-grounded`` workload: prompts whose good answer copies spans of the prompt.

Three tasks, in turn: **rewrite** a prose passage (copy it out), **continue** a passage
whose second copy has begun, and **edit code** (rename a name in a function and give the
whole function back). Real speculative decoding wins come from such requests (editing,
rewriting, retrieval-grounded answers); random-token prompts give n-gram lookup nothing
to copy. The texts are jaxinfer's own module docstrings (prose) and function sources
(code), read from the installed package's files with `ast` (nothing is imported or
downloaded), so a given jaxinfer version always yields the same prompts. Prompts are
text; each passage is cut, at line ends, to at most ``input_len`` tokens. Plain Python;
no JAX import.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Callable

import numpy as np

PACKAGE = Path(__file__).resolve().parents[1]  # the jaxinfer package folder
TASKS = ("rewrite", "continue", "edit-code")
CHARS_PER_TOKEN = 4  # length estimate when no tokenizer is given


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(prose passages, (function name, function source) pairs) from the package's files,
    in sorted file order; passages and functions of at least 400 characters."""
    prose, code = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text)
        doc = ast.get_docstring(tree)
        if doc and len(doc) >= 400:
            prose.append(doc)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                src = ast.get_source_segment(text, node)
                if src and len(src) >= 400:
                    code.append((node.name, src))
    return tuple(prose), tuple(code)


def _trim(text: str, max_tokens: int, count: Callable[[str], int]) -> str:
    """The longest run of leading lines of ``text`` with at most ``max_tokens`` tokens (>= 1 line)."""
    lines = text.splitlines()
    while len(lines) > 1 and count("\n".join(lines)) > max_tokens:
        lines.pop()
    return "\n".join(lines)


def make_prompt(task: str, rng: np.random.Generator, max_tokens: int, count: Callable[[str], int]) -> str:
    """One prompt of ``task`` (one of `TASKS`) from a passage drawn with ``rng``."""
    prose, code = corpus()
    if task == "edit-code":
        name, src = code[int(rng.integers(len(code)))]
        src = _trim(src, max_tokens, count)
        return (f"Rename the function `{name}` to `{name}_v2` in the Python code below and write out the whole "
                f"code with that one change.\n\n```python\n{src}\n```\n\nThe edited code:\n\n```python\n")
    passage = _trim(prose[int(rng.integers(len(prose)))], max_tokens, count)
    if task == "rewrite":
        return f"Copy the following text exactly, line by line.\n\nText:\n{passage}\n\nCopy:\n"
    head = passage[:len(passage) // 3]
    return f"Here is a passage.\n\n{passage}\n\nThe same passage, written out again:\n\n{head}"


def prompts(n: int, input_len: int, rng: np.random.Generator,
            count_tokens: Callable[[str], int] | None = None) -> list[tuple[str, int]]:
    """``n`` (prompt text, prompt tokens) pairs, tasks in turn (`TASKS`).

    Args:
      input_len: most tokens of each passage (the instruction adds a few dozen).
      count_tokens: text -> tokens (no special tokens); None: characters / `CHARS_PER_TOKEN`.
    """
    count = count_tokens or (lambda text: -(-len(text) // CHARS_PER_TOKEN))
    out = []
    for i in range(n):
        text = make_prompt(TASKS[i % len(TASKS)], rng, input_len, count)
        out.append((text, count(text)))
    return out
