"""The reasoning parsers (`jaxinfer.reasoning`): whole-text splits per vLLM's semantics, the
streaming split fed piece by piece (a ``</think>`` cut anywhere) equal to the whole-text one,
and the grammar prefix that starts a constraint after the reasoning (llguidance, SmolLM2's
tokenizer)."""
from __future__ import annotations

import itertools
import re

import pytest

from jaxinfer.reasoning import CONTENT, MAYBE, REASONING, ReasoningStream, get_parser
from jaxinfer.structured_outputs.params import StructuredOutputsParams

R1, QWEN = get_parser("deepseek_r1"), get_parser("qwen3")


def test_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_parser("granite")
    assert get_parser(None) is None


@pytest.mark.parametrize("parser, prompt, kwargs, mode", [
    (R1, "<|im_start|>assistant\n", None, REASONING),
    (R1, "<|im_start|>assistant\n<think>\n", None, REASONING),
    (R1, "<|im_start|>assistant\n<think>\n\n</think>\n\n", None, CONTENT),
    (QWEN, "<|im_start|>assistant\n", None, MAYBE),
    (QWEN, "<|im_start|>assistant\n<think>\n", None, REASONING),  # the template opened it
    (QWEN, "<|im_start|>assistant\n<think>\n\n</think>\n\n", None, CONTENT),  # enable_thinking false's prompt
    (QWEN, "<|im_start|>assistant\n", {"enable_thinking": False}, CONTENT),
    (QWEN, "old turn <think>a</think>b<|im_end|>\n<|im_start|>assistant\n", None, MAYBE),  # only the end counts
    (QWEN, None, None, MAYBE),
])
def test_start_mode(parser, prompt, kwargs, mode):
    assert parser.start_mode(prompt, kwargs) == mode


@pytest.mark.parametrize("parser, mode, text, expected", [
    (R1, REASONING, "Let me see.\n</think>\n\nIt is 4.", ("Let me see.\n", "\n\nIt is 4.")),
    (R1, REASONING, "<think>Hmm</think>4", ("Hmm", "4")),  # a leading <think> the model wrote is dropped
    (R1, REASONING, "no end at all", ("no end at all", None)),  # deepseek_r1: all reasoning
    (R1, REASONING, "</think>answer", (None, "answer")),
    (R1, REASONING, "a</think>b</think>c", ("a", "b</think>c")),  # the first </think> ends it
    (QWEN, MAYBE, "<think>\nwhy\n</think>\n\nbecause", ("\nwhy\n", "\n\nbecause")),
    (QWEN, MAYBE, "plain answer, no reasoning", (None, "plain answer, no reasoning")),
    (QWEN, MAYBE, "the tag </think> alone is text", (None, "the tag </think> alone is text")),
    (QWEN, MAYBE, "<think>cut by max_tokens", ("cut by max_tokens", None)),
    (QWEN, MAYBE, "<thi", (None, "<thi")),
    (QWEN, REASONING, "why</think>because", ("why", "because")),
    (QWEN, CONTENT, "<think>x</think>y", (None, "<think>x</think>y")),
    (QWEN, MAYBE, "", (None, None)),
])
def test_split(parser, mode, text, expected):
    assert parser.split(text, mode) == expected


TEXTS = ["<think>\nstep one\nstep two\n</think>\n\nThe answer.", "Reasoning</think>Answer", "plain",
         "<think>never closed </thi", "a </th b </think> c </think> d", "  <think>x</think>", "<", "<think"]


@pytest.mark.parametrize("parser, mode", [(R1, REASONING), (QWEN, MAYBE), (QWEN, REASONING), (QWEN, CONTENT)])
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_split_equals_whole_text_for_every_cut(parser, mode, text):
    whole = tuple(p or "" for p in parser.split(text, mode))
    cuts = [sorted(c) for c in itertools.combinations(range(1, len(text)), min(2, len(text) - 1))]
    for cut in cuts + [list(range(1, len(text)))]:  # two cuts anywhere, and one character at a time
        stream, got = ReasoningStream(parser, mode), ["", ""]
        for end in cut + [len(text)]:
            dr, dc = stream.update(text[:end], final=end == len(text))
            got[0] += dr
            got[1] += dc
            assert "</think>" not in dr  # the marker never leaks into the reasoning
        assert tuple(got) == whole, (cut, got)


def test_end_marker_split_over_two_pieces_is_never_shown():
    stream = ReasoningStream(R1, REASONING)
    assert stream.update("think hard </th") == ("think hard ", "")
    assert stream.update("think hard </think>\n4") == ("", "\n4")
    assert stream.update("think hard </think>\n42", final=True) == ("", "2")
    q = ReasoningStream(QWEN, MAYBE)
    assert q.update("<th") == ("", "")  # may still open the reasoning
    assert q.update("<think>a") == ("a", "")


@pytest.fixture(scope="module")
def matcher():
    import llguidance
    import llguidance.hf

    from api_helpers import tokenizer

    tok = tokenizer()
    ll = llguidance.hf.from_tokenizer(tok._tok, n_vocab=49152, eos_token=2)

    def accepts(so: StructuredOutputsParams, text: str) -> bool:
        m = llguidance.LLMatcher(ll, so.to_grammar(), log_level=0)
        assert not m.is_error(), m.get_error()
        return bool(m.consume_tokens(tok.encode(text, add_special_tokens=False))) and m.is_accepting()
    return accepts


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_constraint_applies_after_the_reasoning(matcher):
    so = StructuredOutputsParams(json=SCHEMA, reasoning=REASONING)
    assert matcher(so, 'free {"a": text} </thi </think>{"a":1}')
    assert not matcher(so, '{"a":1}')  # still reasoning: no answer yet
    assert not matcher(so, 'x</think>{"b":1}')  # the answer is constrained
    assert not matcher(so, 'x</think>y</think>{"a":1}')  # only one </think>
    choice = StructuredOutputsParams(choice=("Paris", "Rome"), reasoning=MAYBE)
    assert matcher(choice, "Rome") and matcher(choice, "<think>hmm</think>Paris")
    assert not matcher(choice, "<think>hmm</think>Oslo") and not matcher(choice, "hmm</think>Paris")
    plain = StructuredOutputsParams(regex="[A-Z][a-z]+")
    assert matcher(plain, "Oslo") and not matcher(plain, "<think>x</think>Oslo")


def test_reasoning_mode_is_checked_and_part_of_the_cache_key():
    with pytest.raises(Exception, match="reasoning"):
        StructuredOutputsParams(regex="a", reasoning="sometimes")
    assert StructuredOutputsParams(regex="a").cache_key() != StructuredOutputsParams(regex="a",
                                                                                       reasoning=MAYBE).cache_key()


def test_flag_reaches_the_engine_config_and_bad_names_are_refused():
    import server
    from helpers import tiny_config

    args = server.build_parser().parse_args(["--reasoning-parser", "qwen3"])
    assert server.engine_config(args, tiny_config()).reasoning_parser == "qwen3"
    assert server.engine_config(server.build_parser().parse_args([]), tiny_config()).reasoning_parser is None
    with pytest.raises(SystemExit):
        server.build_parser().parse_args(["--reasoning-parser", "granite"])
    with pytest.raises(ValueError, match="reasoning_parser"):
        from jaxinfer.config import EngineConfig
        EngineConfig(model_path="x", reasoning_parser="granite")


def test_llm_applies_constraints_after_the_reasoning():
    """Offline too: with ``reasoning_parser`` the reasoning a prompt leaves open is free text
    (a tiny random model writes no ``</think>`` in 6 tokens), while after a prompt that closed
    it (``... </think>``) the regex holds from the first token."""
    from api_helpers import tokenizer
    from helpers import tiny_config
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.models.params import init_params

    cfg = tiny_config(vocab=49152, hidden=32, layers=1, heads=2, kv_heads=1, inter=32)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, structured_outputs={"regex": "[a-z]{3}"})
    llm = LLM("tiny", max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, num_blocks=16, model_config=cfg,
              params=init_params(cfg, scale=2.0, seed=3), tokenizer=tokenizer(), use_tqdm=False, warmup=False,
              reasoning_parser="deepseek_r1")
    free, closed = (o.outputs[0].text for o in llm.generate(["Think:", "Think: </think>"], params, use_tqdm=False))
    assert re.fullmatch("[a-z]{3}", closed)
    assert not re.fullmatch("[a-z]{3}", free) and "</think>" not in free
    assert llm.engine.num_free_blocks == llm.engine.num_total_blocks
    from jaxinfer.errors import RequestError
    with pytest.raises(RequestError, match="chat_template_kwargs"):  # LLM.chat passes them to the template
        llm.chat([{"role": "user", "content": "hi"}], params, chat_template_kwargs={"messages": []}, use_tqdm=False)
