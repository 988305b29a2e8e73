"""Speculative decoding's host-side parts (issue 17): the acceptance rule, n-gram lookup
against a brute-force search, the config's parsing and refusals, and the switch that
turns speculation off at large batches or low acceptance. No model, no JAX."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxinfer.spec_decode import SpeculativeConfig
from jaxinfer.spec_decode.ngram import NgramProposer
from jaxinfer.spec_decode.switch import SpeculationSwitch
from jaxinfer.spec_decode.verify import accepted_run


def test_accepted_run_is_longest_match_then_target():
    rs = np.random.RandomState(0)
    for _ in range(200):
        k = rs.randint(0, 6)
        drafts = rs.randint(0, 3, k).tolist()
        targets = rs.randint(0, 3, k + 1).tolist()
        run = accepted_run(drafts, targets)
        m = len(run) - 1
        assert run == targets[:m + 1]
        assert drafts[:m] == targets[:m]  # every accepted draft is what the target drew there
        assert m == k or drafts[m] != targets[m]  # stopped at the first mismatch
    with pytest.raises(ValueError):
        accepted_run([1, 2], [1, 2])


def brute_force_ngram(toks, k, lo, hi):
    """The reference lookup: longest suffix n-gram first, its most recent earlier occurrence."""
    for n in range(hi, lo - 1, -1):
        if n >= len(toks):
            continue
        suffix = toks[-n:]
        for s in range(len(toks) - n - 1, -1, -1):
            if toks[s:s + n] == suffix:
                return toks[s + n:s + n + k]
    return []


def test_ngram_matches_brute_force():
    rs = np.random.RandomState(1)
    prop = NgramProposer(2, 4)
    found = 0
    for _ in range(500):
        toks = rs.randint(0, 4, rs.randint(1, 40)).tolist()
        k = rs.randint(0, 6)
        got = prop.propose(toks, k)
        assert got == (brute_force_ngram(toks, k, 2, 4) if k else [])
        found += bool(got)
    assert found > 100  # the comparison exercised real matches


def test_ngram_copies_a_span_of_the_prompt():
    passage = list(range(100, 140))
    ctx = passage + [7, 8] + passage[10:14]  # the output started copying passage[10:]
    assert NgramProposer(2, 4).propose(ctx, 5) == passage[14:19]
    assert NgramProposer(2, 4).propose([1, 2, 3], 5) == []


def test_config_parsing_and_refusals():
    text = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, "prompt_lookup_min": 2}'
    c = SpeculativeConfig.from_value(text)
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == ("ngram", 3, 5, 2)
    assert SpeculativeConfig.from_value(json.loads(text)) == c
    assert SpeculativeConfig.from_value(None) is None
    bad = ['{"method": "eagle"}', '{"method": "ngram", "num_speculative_tokens": 0}',
           '{"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 2}', '{"method": "draft_model"}',
           '{"method": "ngram", "bogus": 1}', '[1]', '{not json', '{"min_acceptance_rate": 2}',
           '{"disable_by_batch_size": 0}']
    for b in bad:
        with pytest.raises(ValueError):
            SpeculativeConfig.from_value(b)
    with pytest.raises(ValueError, match=r"prompt_lookup_max must be an integer >= prompt_lookup_min \(3\), got 2"):
        SpeculativeConfig.from_value(bad[2])  # the bound names the field it comes from


def test_config_refused_with_static_scheduler():
    from jaxinfer.config import EngineConfig, SchedulerConfig

    with pytest.raises(ValueError, match="continuous"):
        EngineConfig("m", scheduler=SchedulerConfig(scheduler="static"), speculative=SpeculativeConfig())


def test_switch_batch_size_and_acceptance():
    sw = SpeculationSwitch(SpeculativeConfig(disable_by_batch_size=8, min_acceptance_rate=0.5, acceptance_window=40,
                                             probe_interval=4))
    assert sw.allows(7) and not sw.allows(8)
    assert sw.recent_acceptance_rate is None  # nothing measured: optimistic
    for _ in range(10):
        sw.record(4, 0)  # 40 drafted, none accepted
    assert sw.recent_acceptance_rate == 0.0
    pattern = [sw.allows(1) for _ in range(8)]
    assert pattern == [False, False, False, True] * 2  # off, with a probe every 4th step
    for _ in range(10):
        sw.record(4, 4)  # the workload starts copying: the window slides past the misses
    assert sw.recent_acceptance_rate == 1.0 and sw.allows(1)
