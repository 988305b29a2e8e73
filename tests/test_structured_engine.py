"""Structured outputs in the engine on a tiny random Llama with SmolLM2's tokenizer: outputs
match their constraint (a random model never would by chance), a constrained and an
unconstrained row share a step without changing each other, nothing compiles after
warm-up, the per-schema grammar compiles once, the sampler's mask step matches numpy."""
from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import jsonschema
import numpy as np
import pytest

from api_helpers import tokenizer
from helpers import tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.errors import RequestError
from jaxinfer.runner.model_runner import CompileCounter
from jaxinfer.models.params import init_params
from jaxinfer.layers.sampler import apply_bitmask

CFG = tiny_config(vocab=49152, hidden=32, layers=1, heads=2, kv_heads=1, inter=32)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    params = init_params(CFG, scale=2.0, seed=3)
    return LLM("tiny", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64, num_blocks=80,
               model_config=CFG, params=params, tokenizer=tokenizer(), use_tqdm=False)


def gen(llm, params, n=1, prompt="Give me JSON:"):
    outs = llm.generate([prompt] * n, [params.replace(seed=i) for i in range(n)] if n > 1 else params,
                        use_tqdm=False)
    return [o.outputs[0] for o in outs]


def test_apply_bitmask_matches_numpy():
    rs = np.random.RandomState(0)
    V = 70
    logits = rs.randn(3, V).astype(np.float32)
    allowed = rs.rand(3, V) < 0.3
    allowed[2] = True
    words = np.zeros((3, 3), np.uint32)
    for r, t in zip(*np.nonzero(allowed)):
        words[r, t // 32] |= np.uint32(1 << (t % 32))
    got = np.asarray(apply_bitmask(jnp.asarray(logits), jnp.asarray(words.view(np.int32))))
    np.testing.assert_array_equal(got, np.where(allowed, logits, -np.inf))


def test_schema_outputs_validate_when_sampled(llm):
    p = SamplingParams(temperature=1.0, max_tokens=60, structured_outputs={"json": SCHEMA})
    for out in gen(llm, p, n=6):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def test_regex_choice_and_json_object(llm):
    for out in gen(llm, SamplingParams(temperature=1.0, max_tokens=20,
                                       structured_outputs={"regex": r"[0-9]{3}-[a-z]{2,4}"}), n=4):
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", out.text) and out.finish_reason == "stop"
    choices = ["yes", "no", "maybe not"]
    for out in gen(llm, SamplingParams(temperature=1.0, max_tokens=20, structured_outputs={"choice": choices}), n=4):
        assert out.text in choices
    (out,) = gen(llm, SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json_object": True}))
    assert out.finish_reason == "length" or isinstance(json.loads(out.text), dict)


def test_mixed_batch_equals_alone_and_no_compilation(llm):
    free = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": SCHEMA})
    before = CompileCounter.count
    alone_free = gen(llm, free, prompt="Hello")[0].token_ids
    alone_json = gen(llm, constrained)[0].token_ids
    both = llm.generate(["Hello", "Give me JSON:"], [free, constrained], use_tqdm=False)
    assert both[0].outputs[0].token_ids == alone_free
    assert both[1].outputs[0].token_ids == alone_json
    assert CompileCounter.count == before
    st = llm.engine.stats
    assert st.mask_steps > 0 and st.mask_rows >= st.mask_steps and st.phase_seconds["mask"] > 0


def test_grammar_compiled_once_per_schema_and_errors(llm):
    g = llm.engine.grammar_engine()
    p = SamplingParams(temperature=0, max_tokens=30, structured_outputs={"json": {"type": "array", "maxItems": 2}})
    gen(llm, p)
    n = g.compilations
    gen(llm, p)
    assert g.compilations == n
    with pytest.raises(RequestError) as e:
        gen(llm, SamplingParams(max_tokens=4, structured_outputs={"regex": "("}))
    assert e.value.param == "structured_outputs"
    with pytest.raises(RequestError):
        SamplingParams(structured_outputs={"regex": "a", "choice": ["b"]})


def test_gbnf_grammar_constrains_and_a_broken_one_is_a_request_error(llm):
    p = SamplingParams(temperature=1.0, max_tokens=6, structured_outputs={"grammar": 'root ::= "yes" | "no"'})
    assert {o.text for o in gen(llm, p, n=4)} <= {"yes", "no"}
    for bad in ("root ::= undefined_rule", "root ::= ("):
        with pytest.raises(RequestError) as e:
            gen(llm, SamplingParams(max_tokens=4, structured_outputs={"grammar": bad}))
        assert e.value.param == "structured_outputs"


@pytest.mark.parametrize("so", [{"json": {"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}},
                                {"grammar": "start: a\na: a"}])
def test_constraint_that_nothing_satisfies_is_a_request_error(llm, so):
    with pytest.raises(RequestError, match="no text satisfies") as e:
        gen(llm, SamplingParams(max_tokens=4, structured_outputs=so))
    assert e.value.param == "structured_outputs"


def test_empty_string_constraint_is_still_accepted(llm):
    out = gen(llm, SamplingParams(max_tokens=4, structured_outputs={"regex": ""}))[0]
    assert out.text == ""


DEFS_TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {
        "$defs": {"i": {"type": "integer", "minimum": 0, "maximum": 9}}, "type": "object",
        "properties": {"x": {"$ref": "#/$defs/i"}}, "required": ["x"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "tree", "parameters": {
        "type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
        "required": ["v", "kids"], "additionalProperties": False}}},
]


@pytest.mark.parametrize("name", ["f", "tree"])
def test_enforced_tool_call_resolves_the_parameters_own_refs(llm, name):
    """A function's parameters may use ``$defs`` / ``#`` references: they resolve inside the
    call grammar, and the arguments validate against the function's own schema."""
    from jaxinfer.structured_outputs import tool_calls

    schema = next(t for t in DEFS_TOOLS if t["function"]["name"] == name)["function"]["parameters"]
    p = SamplingParams(temperature=1.0, max_tokens=120,
                       structured_outputs={"grammar": tool_calls.tool_call_grammar(DEFS_TOOLS, name)})
    outs = [o for o in gen(llm, p, n=3) if o.finish_reason != "length"]
    assert outs  # a random model ends at least one call within max_tokens
    for out in outs:
        _, calls = tool_calls.parse(out.text)
        assert len(calls) == 1 and calls[0]["function"]["name"] == name, out.text
        jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), schema)


def test_single_call_grammar_allows_exactly_one_call(llm):
    """``parallel_tool_calls: false`` with ``tool_choice: required``: one call of any tool, then
    the grammar admits only the end."""
    from jaxinfer.structured_outputs import tool_calls

    p = SamplingParams(temperature=1.0, max_tokens=120,
                       structured_outputs={"grammar": tool_calls.tool_call_grammar(DEFS_TOOLS, single=True)})
    outs = [o for o in gen(llm, p, n=4) if o.finish_reason != "length"]
    assert outs
    for out in outs:
        content, calls = tool_calls.parse(out.text)
        assert content is None and len(calls) == 1, out.text
