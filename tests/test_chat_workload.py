"""The multi-turn chat workload of the cluster benchmark, without servers: presets and flags,
message lengths, think times, the KV pool size and the hit rate from /metrics counters."""
from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest

from api_helpers import REPO
from jaxinfer.bench import chat_workload as cw

sys.path.insert(0, str(REPO / "benchmarks"))


@pytest.fixture(scope="module")
def codec(smollm2_dir):
    return cw.TokenizerCodec(smollm2_dir / "tokenizer.json")


def test_cache_figures_sum_counter_increases_over_instances():
    before = [{"prefix_cache_queries_total": 100.0, "prefix_cache_hits_total": 40.0},
              {"prefix_cache_queries_total": 0.0, "prefix_cache_hits_total": 0.0}]
    after = [{"prefix_cache_queries_total": 400.0, "prefix_cache_hits_total": 240.0},   # +300 queried, +200 hit
             {"prefix_cache_queries_total": 100.0, "prefix_cache_hits_total": 16.0}]    # +100 queried, +16 hit
    f = cw.cache_figures(before, after)
    assert f["query_tokens"] == 400 and f["hit_tokens"] == 216 and f["miss_tokens"] == 184
    assert f["hit_rate"] == pytest.approx(216 / 400)
    assert cw.cache_figures(before, before)["hit_rate"] is None  # nothing queried
    assert f["evicted_blocks"] is None  # servers without the eviction counter


def test_cache_figures_sum_evictions_when_every_reading_has_them():
    before = [{"prefix_cache_queries_total": 0.0, "prefix_cache_hits_total": 0.0, "prefix_cache_evictions_total": 5.0},
              {"prefix_cache_queries_total": 0.0, "prefix_cache_hits_total": 0.0, "prefix_cache_evictions_total": 0.0}]
    after = [{"prefix_cache_queries_total": 64.0, "prefix_cache_hits_total": 16.0, "prefix_cache_evictions_total": 9.0},
             {"prefix_cache_queries_total": 32.0, "prefix_cache_hits_total": 0.0, "prefix_cache_evictions_total": 3.0}]
    assert cw.cache_figures(before, after)["evicted_blocks"] == 7


@pytest.mark.parametrize("after", [[{"prefix_cache_queries_total": 50.0, "prefix_cache_hits_total": 0.0}],
                                   [{"prefix_cache_queries_total": 200.0}]])
def test_cache_figures_reject_a_restarted_instance_or_a_missing_counter(after):
    before = [{"prefix_cache_queries_total": 100.0, "prefix_cache_hits_total": 10.0}]
    with pytest.raises(ValueError):
        cw.cache_figures(before, after)


def test_server_phase_means_weigh_every_instance_by_its_count():
    ttft = "time_to_first_token_seconds"
    before = [{f"{ttft}_sum": 1.0, f"{ttft}_count": 10.0}, {f"{ttft}_sum": 0.0, f"{ttft}_count": 0.0}]
    after = [{f"{ttft}_sum": 1.6, f"{ttft}_count": 13.0},   # +3 requests, 0.6 s in all
             {f"{ttft}_sum": 0.2, f"{ttft}_count": 1.0}]    # +1 request, 0.2 s
    means = cw.server_phase_means(before, after)
    assert means["ttft_s"] == pytest.approx(0.8 / 4)
    assert means["queue_s"] is None and means["tpot_s"] is None  # missing from the readings
    assert cw.server_phase_means(before, before)["ttft_s"] is None  # nothing observed


def test_resolve_shape_applies_only_given_overrides():
    chat = cw.PRESETS["chat"]
    assert cw.resolve_shape("chat") == chat
    s = cw.resolve_shape("chat", turns=9, think_time_s=None, answer_tokens=None)
    assert s == dataclasses.replace(chat, turns=9)
    for bad in ({"preset": "nope"}, {"preset": "chat", "tunrs": 3}, {"preset": "chat", "sessions": 0},
                {"preset": "chat", "cache_sessions": -1.0}):
        with pytest.raises(ValueError):
            cw.resolve_shape(**bad)


def test_cli_flags_override_the_preset_and_travel6_is_the_first_measured_configuration():
    import cluster_bench

    a = cluster_bench.parse_args(["--preset", "travel6"])
    # the configuration of benchmarks/results/2026-12-01-cpu2/cluster.json, with the defaults it ran with
    assert (a.shape.sessions, a.shape.turns, a.shape.answer_tokens, a.shape.think_time_s) == (24, 6, 48, 0.0)
    assert (a.shape.system_tokens, a.shape.user_tokens, a.shape.cache_sessions) == (0, 0, None)
    a = cluster_bench.parse_args(["--turns", "2", "--max-tokens", "7", "--cache-sessions", "0", "--", "--dtype", "float32"])
    assert a.preset == cw.DEFAULT_PRESET and a.shape.turns == 2 and a.shape.answer_tokens == 7
    assert a.shape.cache_sessions is None and a.server_args == ["--dtype", "float32"]
    assert a.shape.user_tokens == cw.PRESETS[cw.DEFAULT_PRESET].user_tokens
    with pytest.raises(SystemExit):  # two ways to size the pool
        cluster_bench.parse_args(["--", "--num-blocks", "100"])


def test_messages_have_the_asked_token_lengths(codec):
    shape = cw.ChatShape(system_tokens=32, user_tokens=40)
    assert abs(len(codec.encode(cw.system_prompt(shape, codec))) - 32) <= 1
    for session, turn in [(0, 0), (5, 1), (23, 7)]:
        text = cw.user_message(shape, session, turn, codec)
        assert abs(len(codec.encode(text)) - 40) <= 1
    assert cw.system_prompt(dataclasses.replace(shape, system_tokens=80), codec).startswith(cw.SYSTEM)
    bare = cw.ChatShape(user_tokens=0, system_tokens=0)
    assert cw.system_prompt(bare, codec) == cw.SYSTEM
    assert cw.user_message(bare, 3, 0, codec) == "I am planning a trip to Iceland. When is the best season to go? (traveller 3)"
    # a user message is extended, never cut: a long question stays whole
    first = cw.user_message(cw.ChatShape(user_tokens=4), 3, 0, codec)
    assert first == cw.user_message(bare, 3, 0, codec)


def test_sessions_share_only_the_system_prompt(codec):
    shape = cw.ChatShape(user_tokens=32)
    firsts = {cw.user_message(shape, s, 0, codec) for s in range(24)}
    assert len(firsts) == 24


def test_think_times_are_seeded_and_within_their_ranges():
    shape = cw.ChatShape(sessions=50, turns=4, think_time_s=2.0)
    t = cw.think_times(shape, seed=1)
    assert t.shape == (50, 4)
    assert np.all((0 <= t[:, 0]) & (t[:, 0] < 2.0))
    assert np.all((1.0 <= t[:, 1:]) & (t[:, 1:] < 3.0))
    assert np.array_equal(t, cw.think_times(shape, seed=1)) and not np.array_equal(t, cw.think_times(shape, seed=2))
    assert not cw.think_times(dataclasses.replace(shape, think_time_s=0.0)).any()


def test_longest_context_bounds_the_rendered_last_prompt(smollm2_dir, codec):
    from jaxinfer.tokenizer.chat import render_conversation
    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(smollm2_dir)
    shape = cw.ChatShape(turns=3, system_tokens=32, user_tokens=24, answer_tokens=20)
    answer = cw.fit_tokens("Lisbon is lovely in May.", " Walk the old town.", shape.answer_tokens, codec)
    assert len(codec.encode(answer)) == shape.answer_tokens
    convo = [{"role": "system", "content": cw.system_prompt(shape, codec)}]
    users = [cw.user_message(shape, 0, t, codec) for t in range(shape.turns)]
    for t, user in enumerate(users):
        convo += [{"role": "user", "content": user}] + ([{"role": "assistant", "content": answer}]
                                                         if t < shape.turns - 1 else [])
    _, ids = render_conversation(convo, tok)
    longest = cw.longest_context_tokens(shape, len(codec.encode(convo[0]["content"])),
                                        [len(codec.encode(u)) for u in users])
    # the last prompt plus a full answer, over-counted by at most one token per system or user
    # message and the last answer's closing tokens
    assert len(ids) + shape.answer_tokens <= longest <= len(ids) + shape.answer_tokens + shape.turns + 3


def test_kv_pool_blocks():
    shape = cw.ChatShape(cache_sessions=2.5)
    assert cw.kv_pool_blocks(shape, 100, 16) == 17  # ceil(250 / 16) = 16, plus the null block
    assert cw.kv_pool_blocks(dataclasses.replace(shape, cache_sessions=None), 100, 16) is None
