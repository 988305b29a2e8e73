"""The ``/v1/responses`` store: LRU order, entry / byte / age limits, deletes, and the memory
it really takes (10,000 responses at the default limits stay within the byte budget, in RSS)."""
from __future__ import annotations

import gc

import pytest

from jaxinfer.entrypoints.openai.responses_store import (DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, ENTRY_OVERHEAD,
                                                         ResponseStore)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def resp(i, text="hello") -> dict:
    return {"id": f"resp_{i}", "object": "response", "output": [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]}


CONVO = [{"type": "message", "role": "user", "content": "hi"}]


def test_round_trip_and_delete():
    s = ResponseStore()
    assert s.put(resp(1), CONVO)
    got = s.get("resp_1")
    assert got.response == resp(1) and got.conversation == CONVO
    assert s.delete("resp_1") and s.get("resp_1") is None and not s.delete("resp_1")
    assert len(s) == 0 and s.bytes_charged == 0


def test_entry_limit_evicts_least_recently_used():
    s = ResponseStore(max_entries=3)
    for i in range(3):
        s.put(resp(i), CONVO)
    assert s.get("resp_0") is not None  # refreshed: resp_1 is now the least recently used
    s.put(resp(3), CONVO)
    assert s.get("resp_1") is None and s.evictions == 1
    assert all(s.get(f"resp_{i}") is not None for i in (0, 2, 3)) and len(s) == 3
    s.delete("resp_0")
    assert s.evictions == 1  # a delete is no eviction


def test_byte_limit_and_oversized_entries():
    s = ResponseStore(max_bytes=3 * (1000 + ENTRY_OVERHEAD + 200))
    for i in range(10):
        assert s.put(resp(i, "x" * 1000), CONVO)
        assert s.bytes_charged <= s.max_bytes
    assert len(s) == 3 and s.get("resp_9") is not None and s.get("resp_6") is None
    assert not s.put(resp(99, "x" * 10_000), CONVO)  # larger than the whole budget: not kept
    assert s.get("resp_99") is None and len(s) == 3


def test_age_limit_counts_from_creation():
    clock = Clock()
    s = ResponseStore(max_age_s=60, clock=clock)
    s.put(resp(0), CONVO)
    clock.t += 30
    s.put(resp(1), CONVO)
    assert s.get("resp_0") is not None  # a read does not extend an entry's life
    clock.t += 31
    assert s.get("resp_0") is None and s.get("resp_1") is not None
    clock.t += 30
    assert s.get("resp_1") is None and len(s) == 0 and s.bytes_charged == 0


def test_replacing_an_id_keeps_the_accounting():
    s = ResponseStore()
    s.put(resp(0, "a" * 100), CONVO)
    s.put(resp(0, "b"), CONVO)
    assert len(s) == 1 and s.get("resp_0").response == resp(0, "b")
    s.delete("resp_0")
    assert s.bytes_charged == 0


def test_disabled_store_keeps_nothing():
    s = ResponseStore(max_entries=0)
    assert not s.enabled and not s.put(resp(0), CONVO) and s.get("resp_0") is None
    with pytest.raises(ValueError):
        ResponseStore(max_age_s=0)


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _typical(i: int) -> tuple[dict, list[dict]]:
    """A response of a ~1 KB answer after a ~2 KB conversation (three turns)."""
    answer = f"answer {i} " + "lorem ipsum dolor sit amet " * 40
    convo = [{"type": "message", "role": r, "content": f"turn {i} {r} " + "consectetur adipiscing " * 30}
             for r in ("user", "assistant", "user")]
    body = {"id": f"resp_{i:032x}", "object": "response", "created_at": 1796535299, "status": "completed",
            "model": "m", "output": [{"id": f"msg_{i:032x}", "type": "message", "role": "assistant",
                                      "status": "completed", "content": [{"type": "output_text", "text": answer,
                                                                          "annotations": [], "logprobs": []}]}],
            "usage": {"input_tokens": 300, "output_tokens": 250, "total_tokens": 550}, "metadata": {}}
    return body, convo


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_10000_responses_at_the_default_limits_stay_within_the_budget():
    """The budget: ``max_bytes`` (256 MiB by default) bounds what the entries are charged, and
    the charge (their JSON + `ENTRY_OVERHEAD`) is what they take in RSS, within 15%."""
    s = ResponseStore()
    assert (s.max_entries, s.max_bytes) == (DEFAULT_MAX_ENTRIES, DEFAULT_MAX_BYTES) == (10_000, 256 << 20)
    gc.collect()
    before = _rss()
    for i in range(10_000):
        s.put(*_typical(i))
    gc.collect()
    grown = _rss() - before
    assert len(s) == 10_000 and s.get(f"resp_{0:032x}") is not None  # all kept: ~3.5 KB each
    assert s.bytes_charged <= s.max_bytes
    assert grown <= 1.15 * s.bytes_charged + (8 << 20), (grown, s.bytes_charged)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/status"), reason="needs /proc (Linux)")
def test_large_responses_are_bounded_by_the_byte_budget():
    """10,000 responses of ~40 KB (400 MB offered) in a 64 MiB store: RSS grows by the budget,
    not by what was offered."""
    s = ResponseStore(max_bytes=64 << 20)
    gc.collect()
    before = _rss()
    big = "y" * 40_000
    for i in range(10_000):
        s.put(resp(i, big), CONVO)
    gc.collect()
    grown = _rss() - before
    assert s.bytes_charged <= 64 << 20 and 1000 < len(s) < 2000
    assert grown <= 1.25 * (64 << 20) + (8 << 20), grown
