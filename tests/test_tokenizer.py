"""Tokenizer wrapper and streaming detokenizer.

References: the reference prompt ids and texts in tests/data/ (made with transformers from
the GGUF), the tokenizer's own one-shot ``decode`` for the streaming invariant, and small
tokenizers built here with the ``tokenizers`` library for the BOS / chat template cases
(SC-23, SC-24).
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from conftest import load_reference
from helpers import assert_imports_no_jax
from jaxinfer.tokenizer.tokenizer import IncrementalDetokenizer, Tokenizer

REPO = Path(__file__).resolve().parents[1]
ORACLE = load_reference()["results"]

MULTIBYTE = "Café naïve résumé — 東京は日本の首都です。emoji: 🎉🚀👩‍👩‍👧 ok ñ ü ß Ωμέγα, 한국어 😀!"


# ---------------------------------------------------------------- fixtures

def make_tiny_tokenizer(path: Path, add_bos: bool, template: str) -> Path:
    """A byte-level BPE tokenizer (vocab ~300) with BOS/EOS and a chat template, saved to ``path``."""
    from tokenizers import Tokenizer as RawTokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = RawTokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(["hello world, hi there: the quick brown fox jumps over the lazy dog"] * 10, trainer)
    if add_bos:
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tk.token_to_id("<s>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = template
    fast.save_pretrained(str(path))
    return path


BOS_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
NO_GEN_PROMPT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"


@pytest.fixture(scope="module")
def smol(smollm2_dir) -> Tokenizer:
    """SmolLM2's tokenizer as converted from the GGUF (``smollm2_dir``: tests/conftest.py)."""
    return Tokenizer.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def bos_tok(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_dir(make_tiny_tokenizer(tmp_path_factory.mktemp("bos_tok"), True, BOS_TEMPLATE))


# ---------------------------------------------------------------- helpers

def stream(tok, prompt_ids, ids, chunks=None, **kw):
    """Feed ``ids`` (in ``chunks`` sizes, default one by one); return (detok, growth pieces, texts)."""
    d = IncrementalDetokenizer(tok, prompt_ids, **kw)
    pieces, texts, i, prev = [], [], 0, ""
    sizes = iter(chunks or [1] * len(ids))
    while i < len(ids):
        n = next(sizes, 1)
        stop = d.step(ids[i:i + n])
        i += n
        assert d.text.startswith(prev), "text shrank or changed"
        pieces.append(d.text[len(prev):])
        prev = d.text
        texts.append(d.text)
        if stop is not None:
            return d, pieces, texts
    final = d.flush()
    assert final.startswith(prev)
    pieces.append(final[len(prev):])
    return d, pieces, texts


def reference(text: str, stop, include=False) -> str:
    """``text`` cut at the first stop string to complete when read left to right."""
    stop = [s for s in stop if s]
    for end in range(1, len(text) + 1):
        hits = [s for s in stop if text[:end].endswith(s)]
        if hits:
            s = max(hits, key=len)
            return text[:end] if include else text[:end - len(s)]
    return text


# ---------------------------------------------------------------- Tokenizer

def test_tokenizer_module_does_not_import_jax(tmp_path):
    tok_dir = make_tiny_tokenizer(tmp_path / "t", True, BOS_TEMPLATE)
    assert_imports_no_jax("from jaxinfer.tokenizer.tokenizer import Tokenizer, IncrementalDetokenizer\n"
                          f"t = Tokenizer.from_dir({str(tok_dir)!r})\n"
                          "ids = t.apply_chat_template([{'role': 'user', 'content': 'hi'}])\n"
                          "d = IncrementalDetokenizer(t, ids, stop=['x']); d.step(t.encode('hello', False)); d.flush()",
                          cwd=REPO)


@pytest.mark.real_model
def test_smollm2_attributes(smol):
    assert (smol.vocab_size, smol.bos_token_id, smol.eos_token_id, smol.add_bos_token) == (49152, 1, 2, False)
    assert {0, 1, 2} <= smol.all_special_ids
    assert smol.convert_ids_to_tokens([7042, 1, 2]) == ["ĠParis", "<|im_start|>", "<|im_end|>"]
    assert not smol.template_ignores_generation_prompt()


@pytest.mark.real_model
@pytest.mark.parametrize("rec", ORACLE, ids=lambda r: f"{r['kind']}{r['index']}")
def test_oracle_prompt_ids_and_texts(smol, rec):
    assert smol.encode(rec["prompt"], add_special_tokens=False) == rec["prompt_ids"]
    assert smol.encode(rec["prompt"]) == rec["prompt_ids"]  # add_bos_token is False
    if rec["kind"] == "chat":
        assert smol.render_chat(rec["messages"]) == rec["prompt"]
        assert smol.apply_chat_template(rec["messages"]) == rec["prompt_ids"]
    assert smol.decode(rec["generated_ids"], skip_special_tokens=False) == rec["generated_text"]
    assert smol.decode(rec["generated_ids"]) == rec["generated_text_skip_special"]


@pytest.mark.real_model
def test_chat_system_and_continue_final_message(smol):
    """SC-24: a given system prompt replaces the default one; continuing leaves the turn open."""
    text = smol.render_chat([{"role": "system", "content": "Answer with the word ZEBRA."},
                             {"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("ZEBRA") == 1 and text.index("ZEBRA") < text.index("<|im_start|>user")
    assert "SmolLM" not in text
    cont = smol.render_chat([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Sure, the"}],
                            continue_final_message=True)
    assert cont.endswith("<|im_start|>assistant\nSure, the")


def test_exactly_one_bos(bos_tok):
    """SC-23: a template that writes BOS plus a tokenizer that adds BOS -> one BOS."""
    assert bos_tok.add_bos_token
    bos = bos_tok.bos_token_id
    ids = bos_tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids[0] == bos and ids.count(bos) == 1
    assert ids == bos_tok.encode(bos_tok.render_chat([{"role": "user", "content": "hi"}]), add_special_tokens=False)
    text_ids = bos_tok.encode("hi")
    assert text_ids[0] == bos and text_ids.count(bos) == 1
    assert bos_tok.encode("hi", add_special_tokens=False) == text_ids[1:]


def test_template_without_generation_prompt_branch(tmp_path):
    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, False, NO_GEN_PROMPT_TEMPLATE))
    assert tok.template_ignores_generation_prompt()
    assert not tok.add_bos_token


# ---------------------------------------------------------------- IncrementalDetokenizer

@pytest.mark.real_model
def test_stream_multibyte_token_by_token(smol):
    ids = smol.encode(MULTIBYTE, add_special_tokens=False)
    partial = [i for i in ids if "\ufffd" in smol.decode([i])]
    assert len(partial) >= 5, "the text should contain tokens that are parts of a character"
    prompt = smol.encode("Say something:", add_special_tokens=False)
    d, pieces, texts = stream(smol, prompt, ids)
    assert "".join(pieces) == smol.decode(ids) == MULTIBYTE
    assert all("\ufffd" not in t for t in texts)
    for n, t in enumerate(texts):  # text is held back only while a character is incomplete
        seen = smol.decode(ids[:n + 1])
        assert t == seen or (seen.startswith(t) and seen.endswith("\ufffd"))
    assert d.flush() == MULTIBYTE


@pytest.mark.real_model
@pytest.mark.parametrize("rec", ORACLE, ids=lambda r: f"{r['kind']}{r['index']}")
@pytest.mark.parametrize("skip", [True, False])
def test_stream_oracle_generations(smol, rec, skip):
    _, pieces, _ = stream(smol, rec["prompt_ids"], rec["generated_ids"], skip_special_tokens=skip)
    assert "".join(pieces) == rec["generated_text_skip_special" if skip else "generated_text"]


@pytest.mark.real_model
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_spanning_tokens(smol, include):
    rec = ORACLE[0]  # ' Paris.\n\nThe answer is: 2018-01-22 12:12:53.<|im_end|>'
    ids = rec["generated_ids"]
    stop = ["answer is: 20", "zzz"]
    assert not any(stop[0] in smol.decode([i]) for i in ids)  # the stop string spans tokens
    d, pieces, texts = stream(smol, rec["prompt_ids"], ids, stop=stop, include_stop_str_in_output=include)
    want = " Paris.\n\nThe answer is: 20" if include else " Paris.\n\nThe "
    assert d.finished and d.stop_reason == "answer is: 20" and d.text == want == "".join(pieces)
    assert all("answer" not in t for t in texts[:-1])  # held back while the stop string was forming
    assert d.flush() == want


@pytest.mark.real_model
def test_first_stop_to_complete_wins(smol):
    ids = smol.encode("The capital of Japan is Tokyo. Yes.", add_special_tokens=False)
    for stop in (["Tokyo.", "Japan is Tokyo"], ["Japan is Tokyo", "Tokyo."]):
        d, _, _ = stream(smol, [], ids, stop=stop)
        assert d.stop_reason == "Japan is Tokyo" and d.text == "The capital of "


@pytest.mark.real_model
def test_held_back_stop_prefix_released_at_flush(smol):
    ids = smol.encode("It ends with ###", add_special_tokens=False)
    d = IncrementalDetokenizer(smol, [], stop=["####"])
    for i in ids:
        assert d.step([i]) is None
    assert d.text == "It ends with "  # '###' could still become '####'
    assert d.flush() == "It ends with ###" == d.text


@pytest.mark.real_model
@pytest.mark.parametrize("seed", range(6))
def test_stream_invariant_random(smol, seed):
    """Random token sequences (bytes, special tokens, multi-byte text), random chunking, stops."""
    rng = random.Random(seed)
    pool = (smol.encode(MULTIBYTE, add_special_tokens=False) + list(range(0, 20))
            + [rng.randrange(smol.vocab_size) for _ in range(40)] + list(range(60, 300)))
    ids = [rng.choice(pool) for _ in range(rng.randrange(20, 80))]
    full = smol.decode(ids, skip_special_tokens=seed % 2 == 0)
    stop = [full[a:a + rng.randrange(1, 5)] for a in [rng.randrange(max(1, len(full)))]] if seed % 3 else []
    stop.append("never-appears-§")
    chunks = [rng.randrange(1, 4) for _ in ids]
    for include in (False, True):
        d, pieces, texts = stream(smol, [], ids, chunks=chunks, skip_special_tokens=seed % 2 == 0, stop=stop,
                                  include_stop_str_in_output=include)
        assert "".join(pieces) == reference(full, stop, include) == d.text
        for n, t in enumerate(texts[:-1]):
            assert smol.decode(ids[:sum(chunks[:n + 1])], skip_special_tokens=seed % 2 == 0).startswith(t)


def test_prompt_ending_mid_character(bos_tok):
    """A prompt cut inside a UTF-8 sequence is not used as context: output decodes on its own."""
    ids = bos_tok.encode("é", add_special_tokens=False)
    assert len(ids) == 2  # two byte tokens
    out = bos_tok.encode("hello", add_special_tokens=False)
    _, pieces, _ = stream(bos_tok, ids[:1], out)
    assert "".join(pieces) == "hello"


def test_step_after_finish_raises(bos_tok):
    d = IncrementalDetokenizer(bos_tok, [], stop=["lo"])
    assert d.step(bos_tok.encode("hello", add_special_tokens=False)) == "lo"
    assert d.text == "hel"
    with pytest.raises(RuntimeError):
        d.step([5])
