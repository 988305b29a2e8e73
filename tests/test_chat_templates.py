"""``--chat-template``: bundled templates, the value rules, and a template given to a tokenizer
that has none (small tokenizers built with the ``tokenizers`` library; the real Gemma 3
tokenizer is in tests/test_gemma_chat.py). References: the Gemma 3 template copied into
tests/data/gemma3/, and transformers' own ``apply_chat_template`` with an explicit template."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from conftest import DATA, ROOT
from helpers import assert_imports_no_jax
from jaxinfer.engine.builder import apply_chat_template
from jaxinfer.tokenizer.chat import render_conversation, supports_system_role
from jaxinfer.errors import RequestError
from jaxinfer.tokenizer.templates import bundled_names, load_chat_template
from jaxinfer.tokenizer.tokenizer import Tokenizer
from test_tokenizer import make_tiny_tokenizer

GEMMA3_TEMPLATE = (DATA / "gemma3" / "chat_template.jinja").read_text()
NO_SYSTEM_TEMPLATE = ("{% for m in messages %}{% if m['role'] != 'system' %}<|{{ m['role'] }}|>{{ m['content'] }}"
                      "</s>{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture
def bare_tok(tmp_path) -> Tokenizer:
    """A BOS-adding tokenizer saved (in ``tmp_path``) without a chat template, as a base model's."""
    tok = Tokenizer.from_dir(make_tiny_tokenizer(tmp_path, True, ""))
    assert not tok.has_chat_template
    return tok


def test_bundled_gemma3_is_the_reference_template():
    assert "gemma3" in bundled_names()
    assert load_chat_template("gemma3") == GEMMA3_TEMPLATE


def test_bundled_templates_are_package_data():
    """Every bundled template is matched by the package-data globs (so wheels carry it)."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["jaxinfer.tokenizer.templates"]
    for name in bundled_names():
        assert any(Path(f"{name}.jinja").match(g) for g in globs), (name, globs)


def test_file_inline_and_bad_values(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(NO_SYSTEM_TEMPLATE)
    assert load_chat_template(str(f)) == NO_SYSTEM_TEMPLATE
    assert load_chat_template(NO_SYSTEM_TEMPLATE) == NO_SYSTEM_TEMPLATE  # inline text, as vLLM allows
    with pytest.raises(ValueError, match="gemma3"):  # names what is bundled
        load_chat_template("gemma-nine")
    (tmp_path / "empty.jinja").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        load_chat_template(str(tmp_path / "empty.jinja"))


def test_no_template_is_a_400_naming_the_flag(bare_tok):
    with pytest.raises(RequestError, match="--chat-template") as exc:
        render_conversation([{"role": "user", "content": "hi"}], bare_tok)
    assert exc.value.param == "messages"


def test_given_template_renders_as_transformers_does(bare_tok, tmp_path):
    """The gemma3 template on a template-less tokenizer: same text and ids as transformers'
    ``apply_chat_template(chat_template=...)``, system text folded into the first user turn."""
    tok = apply_chat_template(bare_tok, "gemma3")
    convo = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"},
             {"role": "assistant", "content": "hi"}, {"role": "user", "content": "the fox"}]
    text, ids = render_conversation(convo, tok)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    want = hf.apply_chat_template(convo, chat_template=GEMMA3_TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert text == want and ids == tok.encode(want, add_special_tokens=False)
    assert ids.count(tok.bos_token_id) == 1  # the template writes BOS; encoding adds none
    assert "user\nbe brief\n\nhello world" in text


def test_given_template_leaves_the_original_and_probes_its_own_system_role(bare_tok):
    """Each templated tokenizer is new (the given one keeps no template) and is probed for a
    system role on its own template."""
    no_system = apply_chat_template(bare_tok, NO_SYSTEM_TEMPLATE)
    gemma = apply_chat_template(no_system, "gemma3")
    assert not bare_tok.has_chat_template and no_system.chat_template == NO_SYSTEM_TEMPLATE
    assert not supports_system_role(no_system) and supports_system_role(gemma)
    text, _ = render_conversation([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                                  no_system)
    assert text == "<|user|>be brief\n\nhi</s><|assistant|>"  # merged by jaxinfer.tokenizer.chat, not dropped


def test_chat_template_needs_a_tokenizer():
    with pytest.raises(ValueError, match="tokenizer"):
        apply_chat_template(None, "gemma3")
    assert apply_chat_template(None, None) is None


def test_templates_import_no_jax():
    assert_imports_no_jax("from jaxinfer.tokenizer.templates import load_chat_template\nload_chat_template('gemma3')")


def test_llm_refuses_a_bad_chat_template_before_loading():
    from jaxinfer import LLM

    with pytest.raises(ValueError, match="--chat-template 'nope'"):  # not the unknown model's error
        LLM("no-such-model", chat_template="nope")


def test_every_apply_chat_template_option_is_a_reserved_template_kwarg():
    """``chat_template_kwargs`` are template variables only: a name transformers'
    ``apply_chat_template`` takes as an option of its own (``sanitize_control_tokens`` came in
    transformers 5.x) must be refused with param ``chat_template_kwargs``, not passed through
    (where it either changed the call or failed as "the template rejected the messages")."""
    import inspect

    from transformers import PreTrainedTokenizerBase

    from jaxinfer.tokenizer.chat import RESERVED_TEMPLATE_KWARGS, check_template_kwargs

    sig = inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters.values()
    options = {p.name for p in sig if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD}
    assert options <= RESERVED_TEMPLATE_KWARGS, sorted(options - RESERVED_TEMPLATE_KWARGS)
    for name in sorted(options):
        with pytest.raises(RequestError, match=name) as exc:
            check_template_kwargs({name: True})
        assert exc.value.param == "chat_template_kwargs"
    assert check_template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
