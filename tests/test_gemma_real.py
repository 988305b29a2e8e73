"""The real Gemma 3 270M (converted from its PyPI GGUF) against transformers' float32 reference
(``tests/data/gemma3/``): first-position logits, and greedy tokens alone, batched, under forced
preemption and with prefix caching on and off. Near-tie steps (top-2 margin below `TIE`) may
pick the other token; the run is compared up to there."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import borrowed_runner, run_until_idle
from jaxinfer import LLM, SamplingParams

pytestmark = pytest.mark.real_model
TIE = 0.01  # the reference marks steps whose top-2 logit margin is below this as near-ties


@pytest.fixture(scope="module")
def llm(gemma3_dir):
    return LLM(str(gemma3_dir), dtype="float32", max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=256,
               num_blocks=400, return_logits=True, use_tqdm=False, warmup=False, chat_template="gemma3")


def assert_matches_reference(token_ids, ref):
    """Tokens equal the reference's up to its first near-tie step where they differ."""
    want, margins = ref["generated_ids"], ref["top1_minus_top2_margin_per_step"]
    for i, (got, exp) in enumerate(zip(token_ids, want)):
        if got != exp:
            assert margins[i] < TIE, f"prompt {ref['index']} step {i}: {got} != {exp} (margin {margins[i]})"
            return
    assert len(token_ids) == len(want)


def test_first_logits_match_reference(llm, gemma3_oracle):
    from conftest import DATA

    by_index = {p["index"]: p for p in gemma3_oracle["prompts"]}
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    for idx, name in ((0, "logits_prompt00_first_gen.npy"), (8, "logits_prompt08_first_gen.npy")):
        want = np.load(DATA / "gemma3" / name)
        got = llm.generate([by_index[idx]["prompt_ids"]], one)[0].outputs[0].logits[0]
        assert np.abs(got - want).max() < 1e-3, (idx, np.abs(got - want).max())


def test_chat_with_bundled_template_matches_reference(llm, gemma3_oracle):
    """`LLM.chat` with ``chat_template="gemma3"``: the reference's prompt ids and first tokens."""
    ref = next(r for r in gemma3_oracle["prompts"] if r["kind"] == "chat")
    out = llm.chat(ref["messages"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                   use_tqdm=False)[0]
    assert out.prompt_token_ids == ref["prompt_ids"]
    assert_matches_reference(out.outputs[0].token_ids, dict(ref, generated_ids=ref["generated_ids"][:4]))


@pytest.mark.slow
def test_greedy_matches_reference_alone_batched_preempted_and_cached(llm, gemma3_oracle):
    refs = gemma3_oracle["prompts"]
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    batched = llm.generate([r["prompt_ids"] for r in refs], sp)
    for r, o in zip(refs, batched):
        assert_matches_reference(o.outputs[0].token_ids, r)
    alone = llm.generate([refs[0]["prompt_ids"]], sp)[0]
    assert alone.outputs[0].token_ids == batched[0].outputs[0].token_ids
    with borrowed_runner(llm.engine, 60) as e:  # 59 blocks for ~120 needed: forced preemption
        for i, r in enumerate(refs):
            e.add_request(str(i), r["prompt_ids"], sp)
        done = run_until_idle(e)
        assert e.scheduler.num_preemptions > 0
        for i, r in enumerate(refs):
            assert_matches_reference(done[str(i)].outputs[0].token_ids, r)
    for caching in (True, False):
        with borrowed_runner(llm.engine, enable_prefix_caching=caching) as e:
            for i, r in enumerate(refs[:2]):  # twice each: the second run hits the cache when it is on
                for rep in range(2):
                    e.add_request(f"{i}-{rep}", r["prompt_ids"], sp)
                    done = run_until_idle(e)
                    assert done[f"{i}-{rep}"].outputs[0].token_ids == batched[i].outputs[0].token_ids
