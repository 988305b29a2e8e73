"""Reasoning output: splitting a model's ``<think>...</think>`` text from its answer
(``--reasoning-parser``). `parser` owns the parsers (vLLM's ``qwen3`` and ``deepseek_r1``),
the whole-text and the incremental (streaming) split, and the grammar prefix that lets a
structured-output constraint start after the reasoning. Plain Python; no JAX.
"""
from jaxinfer.reasoning.parser import (CONTENT, END, MAYBE, MODES, PARSERS, PROMPT_TAIL_TOKENS, REASONING, START,
                                       ReasoningParser, ReasoningStream, get_parser, grammar_prefix)

__all__ = ["CONTENT", "END", "MAYBE", "MODES", "PARSERS", "PROMPT_TAIL_TOKENS", "REASONING", "START",
           "ReasoningParser", "ReasoningStream", "get_parser", "grammar_prefix"]
