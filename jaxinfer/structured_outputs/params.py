"""`StructuredOutputsParams`: what a request's output must match (vLLM's ``structured_outputs``).

Owns the constraint kinds and their translation to one llguidance grammar string:
``json`` (a JSON schema, or ``True`` / ``json_object`` for any JSON object), ``regex``,
``choice`` (one of a list of strings), ``grammar`` (Lark, as llguidance reads it; EBNF in
GBNF form is converted). Exactly one kind per request. Plain Python: the grammar engine
(`jaxinfer.structured_outputs.grammar`) compiles the string; invalid constraints are `RequestError` naming
``structured_outputs`` (or the alias the API passes).

Reference: vLLM ``StructuredOutputsParams``; llguidance's grammar formats
(https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md).
"""
from __future__ import annotations

import dataclasses
import json
import re

from jaxinfer import reasoning as reasoning_mod
from jaxinfer.errors import RequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object")
# JSON without free whitespace between tokens (``{"a":1}``): a model cannot pad its output
# with newlines up to max_tokens; a schema's ``x-guidance`` may still ask for it
JSON_DEFAULTS = {"whitespace_flexible": False}
MAX_CONSTRAINT_CHARS = 200_000  # a schema/grammar larger than this is refused (compile time is unbounded)
ANSWER = "jaxinfer_answer"  # the constrained answer's grammar name under a reasoning prefix


@dataclasses.dataclass(frozen=True)
class StructuredOutputsParams:
    """One output constraint; exactly one field set.

    Attributes:
      json: a JSON schema (dict or JSON string); the output is JSON that validates.
      regex: the output matches this regex (whole output).
      choice: the output is exactly one of these strings.
      grammar: a Lark grammar (llguidance dialect) or GBNF (detected by ``::=``).
      json_object: the output is any JSON object (OpenAI ``{"type": "json_object"}``).
      reasoning: where the constraint starts: None (the first token), or a reasoning mode of
        `jaxinfer.reasoning` (``"reasoning"``: after the ``</think>`` that ends the
        reasoning the output starts in; ``"maybe"``: after a leading ``<think>...</think>``
        if the output opens one, else at once), so reasoning text stays free (vLLM applies
        structured outputs after the reasoning ends). Not a kind: it goes with one.
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool = False
    reasoning: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.json, dict):  # stored as text: hashable, a cache key (key order kept: it is
            object.__setattr__(self, "json", json.dumps(self.json))  # the order properties are written in)
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise RequestError("choice must be a non-empty list of strings", param="structured_outputs")
            object.__setattr__(self, "choice", tuple(self.choice))
        set_kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise RequestError(f"structured_outputs needs exactly one of {', '.join(KINDS)}; got "
                               f"{set_kinds or 'none'}", param="structured_outputs")
        for k in ("json", "regex", "grammar"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, str) or len(v) > MAX_CONSTRAINT_CHARS):
                raise RequestError(f"structured_outputs.{k} must be a string (or a schema object) of at most "
                                   f"{MAX_CONSTRAINT_CHARS} characters", param="structured_outputs")
        if self.reasoning not in (None, reasoning_mod.REASONING, reasoning_mod.MAYBE):
            raise RequestError(f"structured_outputs.reasoning must be None, {reasoning_mod.REASONING!r} or "
                               f"{reasoning_mod.MAYBE!r}", param="structured_outputs")
        if self.json is not None:
            try:
                schema = json.loads(self.json)
            except ValueError as exc:
                raise RequestError(f"structured_outputs.json is not valid JSON: {exc}",
                                   param="structured_outputs") from None
            if not isinstance(schema, (dict, bool)):
                raise RequestError("a JSON schema must be an object", param="structured_outputs")

    @classmethod
    def from_dict(cls, d: dict) -> "StructuredOutputsParams":
        """From vLLM's request field ``{"json" | "regex" | "choice" | "grammar" | "json_object": ...}``.

        Raises:
          RequestError: not a dict, unknown keys, none or several kinds.
        """
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise RequestError("structured_outputs must be an object", param="structured_outputs")
        unknown = set(d) - set(KINDS) - {"disable_fallback", "disable_any_whitespace",
                                         "disable_additional_properties", "whitespace_pattern"}
        if unknown:
            raise RequestError(f"unknown structured_outputs fields {sorted(unknown)}", param="structured_outputs")
        fields = {k: d[k] for k in KINDS if d.get(k) is not None}
        if fields.get("json") is True:  # vLLM accepts json: true? treat as any object
            del fields["json"]
            fields["json_object"] = True
        return cls(**fields)

    def after_reasoning(self, mode: str | None) -> "StructuredOutputsParams":
        """This constraint for an output that starts in reasoning mode ``mode``
        (`jaxinfer.reasoning.ReasoningParser.start_mode`; None or ``"content"``: as is)."""
        if mode in (None, reasoning_mod.CONTENT):
            return self
        return dataclasses.replace(self, reasoning=mode)

    def cache_key(self) -> tuple:
        """Hashable identity of the constraint (the grammar cache's key)."""
        return (self.json, self.regex, self.choice, self.grammar, self.json_object, self.reasoning)

    def to_grammar(self) -> str:
        """The llguidance grammar string (JSON-encoded top-level grammar, or Lark text) for
        this constraint, after the reasoning when `reasoning` is set."""
        answer = self._answer_grammar()
        prefix = reasoning_mod.grammar_prefix(self.reasoning, ANSWER) if self.reasoning else None
        return answer if prefix is None else after_prefix(prefix, answer)

    def _answer_grammar(self) -> str:
        import llguidance

        m = llguidance.LLMatcher
        if self.json_object:
            return m.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
        if self.json is not None:
            return m.grammar_from_json_schema(self.json, defaults=JSON_DEFAULTS)
        if self.regex is not None:
            return m.grammar_from_regex(self.regex)
        if self.choice is not None:
            return m.grammar_from_regex("|".join(re.escape(c) for c in self.choice))
        if "::=" in self.grammar:  # GBNF (llama.cpp's EBNF dialect)
            return m.grammar_from_lark(_gbnf_to_lark(self.grammar))
        return m.grammar_from_lark(self.grammar)


def after_prefix(lark: str, grammar: str, name: str = ANSWER) -> str:
    """A top-level llguidance grammar (JSON) whose start is the Lark text ``lark``, which
    refers to ``grammar`` (llguidance's JSON top-level grammar or Lark text) as ``@name``."""
    if grammar.lstrip().startswith("{"):
        inner = json.loads(grammar)["grammars"]
    else:
        inner = [{"lark_grammar": grammar}]
    inner = [dict(inner[0], name=name)] + inner[1:]
    return json.dumps({"grammars": [{"lark_grammar": lark}] + inner})


def _gbnf_to_lark(text: str) -> str:
    """llguidance's GBNF-to-Lark translation (``llguidance.gbnf_to_lark.gbnf_to_lark``).

    Raises:
      ValueError: the GBNF does not parse or names an undefined rule (llguidance raises a
        plain ``Exception`` for some of these).
    """
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(text)
    except Exception as exc:  # noqa: BLE001 - GbnfToLarkError and bare Exceptions alike
        raise ValueError(f"GBNF: {exc}") from None
