"""The real SmolLM2-135M-Instruct under ``scheduling_policy="priority"``: priority-0
requests submitted after priority-5 ones in the same call go first, and every output
still equals transformers' greedy reference (tests/data/)."""
from __future__ import annotations

import pytest

from jaxinfer import LLM, SamplingParams

pytestmark = pytest.mark.real_model
MAX_TOKENS = 4


def test_priority_requests_go_first_with_unchanged_outputs(smollm2_dir, oracle):
    recs = oracle["results"][:4]
    llm = LLM(str(smollm2_dir), dtype="float32", max_model_len=256, max_num_seqs=1, max_num_batched_tokens=128,
              num_blocks=64, warmup=False, scheduling_policy="priority", use_tqdm=False)
    priorities = [5, 5, 0, 0]  # the interactive ones come last in submission order
    outs = llm.generate([r["prompt_ids"] for r in recs], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
                        use_tqdm=False, priority=priorities)
    for rec, out in zip(recs, outs):
        assert out.outputs[0].token_ids == rec["generated_ids"][:MAX_TOKENS], rec["index"]
    first_token = [o.metrics.first_token_time for o in outs]
    order = sorted(range(len(outs)), key=lambda i: first_token[i])
    assert order == sorted(range(len(outs)), key=lambda i: (priorities[i], i))  # (priority, arrival)
    assert max(first_token[2:]) < min(first_token[:2])
