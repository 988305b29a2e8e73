"""The benchmark's side of speculative decoding (issue 17): the input-grounded workload
(text prompts that copy spans of jaxinfer's own sources, reproducible, bounded by
``--input-len``), and the acceptance numbers of a run from two ``/metrics`` readings."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from jaxinfer.bench import grounded, report, serve, stats, workloads
from jaxinfer.bench.client import RequestResult
from jaxinfer.bench.workloads import WorkloadConfig
from jaxinfer.spec_decode.ngram import NgramProposer


def words(text: str) -> int:
    return len(text.split())


def test_input_grounded_prompts_are_reproducible_text_within_length():
    cfg = WorkloadConfig(name=workloads.INPUT_GROUNDED, num_requests=9, input_len=120, output_len=64)
    reqs = workloads.build_requests(cfg, count_tokens=words)
    again = workloads.build_requests(cfg, count_tokens=words)
    assert [r.prompt for r in reqs] == [r.prompt for r in again]
    assert all(isinstance(r.prompt, str) and r.output_len == 64 and r.prompt_len == words(r.prompt) for r in reqs)
    assert any("```python" in r.prompt for r in reqs) and any("Copy:" in r.prompt for r in reqs)
    prose, code = grounded.corpus()
    for r in reqs:  # each passage (at most input_len words) appears in the prompt, taken from the sources
        body = r.prompt.split("\n\n")[2] if "```python" not in r.prompt else r.prompt.split("```python\n")[1]
        assert words(body.split("\n```")[0]) <= 120 + 5
    assert len(prose) > 10 and len(code) > 50
    assert [r.prompt for r in workloads.build_requests(cfg, seed_offset=1, count_tokens=words)] != [r.prompt for r in reqs]


def test_copying_answer_is_what_ngram_lookup_proposes():
    """Word-level stand-in for tokens: once a rewrite's answer has begun, lookup proposes
    the passage's next words, so copying answers are accepted."""
    rng = np.random.default_rng(0)
    text = grounded.make_prompt("rewrite", rng, 80, words)
    passage = text.split("Text:\n")[1].split("\n\nCopy:")[0].split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(text.split()))}
    ids = [vocab[w] for w in text.split()]
    answer = [vocab[w] for w in passage]
    hits = sum(NgramProposer(2, 4).propose(ids + answer[:i], 1) == [answer[i]] for i in range(3, len(answer)))
    assert hits >= 0.8 * (len(answer) - 3)


def test_prompt_format_for_input_grounded():
    ns = argparse.Namespace(endpoint="completions", prompt_format=None, workload=workloads.INPUT_GROUNDED)
    assert serve.prompt_format(ns) == "text"
    with pytest.raises(ValueError, match="text"):
        serve.prompt_format(argparse.Namespace(endpoint="completions", prompt_format="token-ids",
                                               workload=workloads.INPUT_GROUNDED))


def test_spec_decode_summary_and_console_lines():
    before = {"spec_decode_num_drafts_total": 10.0, "spec_decode_num_draft_tokens_total": 40.0,
              "spec_decode_num_accepted_tokens_total": 20.0}
    after = {"spec_decode_num_drafts_total": 30.0, "spec_decode_num_draft_tokens_total": 120.0,
             "spec_decode_num_accepted_tokens_total": 80.0}
    s = serve.spec_decode_summary(before, after)
    assert s == {"num_drafts": 20, "num_draft_tokens": 80, "num_accepted_tokens": 60, "acceptance_rate": 0.75,
                 "mean_acceptance_length": 4.0}
    assert serve.spec_decode_summary(before, before) is None and serve.spec_decode_summary({}, after) is None
    r = RequestResult("ok", 200, 5, 3, 0.0, prompt_tokens=5, output_tokens=3, ttft=0.1, e2el=0.3, itl=[0.1, 0.1])
    summary = stats.aggregate([r], 1.0)
    summary["spec_decode"] = s
    text = report.console_summary(summary)
    assert "Acceptance rate (%):" in text and "75.00" in text and "Acceptance length:" in text and "4.00" in text
