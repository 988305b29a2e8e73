"""The engine protocol: `LLMEngine` and `DataParallelRouter` both implement it, and
``add_requests`` is one all-or-none admission path on either (fake runner); the router hands
out its replicas' one grammar engine, so a constraint compiles off the engine thread."""
from __future__ import annotations

import pytest

from api_helpers import EOS, EOS_B, V, fake_engine, tokenizer
from jaxinfer.engine.dp_router import DataParallelRouter
from jaxinfer.engine.protocol import Engine, EngineDescription, RequestSpec, SharedGrammar
from jaxinfer.errors import QueueFullError, RequestError
from jaxinfer.sampling_params import SamplingParams


def spec(rid: str, prompt=(1, 2, 3), **params) -> RequestSpec:
    return RequestSpec(rid, list(prompt), SamplingParams(max_tokens=2, **params))


@pytest.fixture()
def router():
    r = DataParallelRouter([fake_engine(max_queue_len=3, max_num_seqs=1), fake_engine(max_queue_len=3, max_num_seqs=1)])
    yield r
    r.shutdown()


def test_engine_and_router_implement_the_protocol(router):
    assert isinstance(fake_engine(), Engine) and isinstance(router, Engine)


@pytest.mark.parametrize("bad", [spec("b", prompt=()), spec("a"), spec("b", prompt=(10**9,))])
def test_add_requests_is_all_or_none(bad):
    e = fake_engine()
    with pytest.raises(RequestError):
        e.add_requests([spec("a"), spec("c"), bad])  # an empty prompt, a duplicate id, an id past the vocabulary
    assert e.num_waiting == 0 and not e.requests and e.snapshot().prompt_tokens == 0


def test_add_requests_checks_room_for_the_whole_group():
    e = fake_engine(max_queue_len=3, max_num_seqs=1)
    e.add_requests([spec("a"), spec("b"), spec("c")])  # one takes the free slot, 2 are queued
    with pytest.raises(QueueFullError):
        e.add_requests([spec("d"), spec("e")])
    with pytest.raises(RequestError) as exc:  # could never be queued at once: a 400, not "retry later"
        fake_engine(max_queue_len=3).add_requests([spec(str(i)) for i in range(4)])
    assert exc.value.param == "n"
    assert e.num_waiting == 3


def test_router_spreads_a_group_and_admits_it_all_or_none(router):
    router.add_requests([spec(str(i)) for i in range(4)])
    assert [e.num_waiting for e in router.engines] == [2, 2]
    with pytest.raises(QueueFullError):  # 4 more fit (3 queued + 1 free slot per replica), 5 do not
        router.add_requests([spec(f"x{i}") for i in range(5)])
    with pytest.raises(RequestError):
        router.add_requests([spec("y"), spec("y")])
    with pytest.raises(RequestError):
        router.add_requests([spec("z"), spec("0")])  # "0" lives on a replica
    assert [e.num_waiting for e in router.engines] == [2, 2]
    while router.has_unfinished_requests():
        router.step()
    assert router.snapshot().finished["length"] == 4


def test_a_burst_fills_the_free_slots_before_anything_counts_as_queued():
    """Between two steps, requests up to the free sequence slots plus ``max_queue_len`` are
    taken; one more is a 429 (counting every waiting request refused a burst while the
    slots stood empty)."""
    e = fake_engine(max_queue_len=2, max_num_seqs=4)
    for i in range(6):  # 4 free slots + 2 queued
        e.add_requests([spec(f"b{i}")])
    with pytest.raises(QueueFullError):
        e.add_requests([spec("over")])
    e.step()  # the 4 start: 2 waiting, 0 free slots, 2 queued: still full
    assert e.num_running == 4 and e.scheduler.num_queued == 2
    with pytest.raises(QueueFullError):
        e.add_requests([spec("over")])


def test_arrival_time_is_the_specs_never_later_than_now():
    """A spec's ``arrival_time`` (the server's receipt) is the request's arrival, so its queue
    time and TTFT include the wait before the engine took it; a time in the future (another
    clock) is clamped to when the engine took it; None means then."""
    import time
    e = fake_engine()
    now = time.monotonic()
    e.add_requests([RequestSpec("past", [1, 2], SamplingParams(max_tokens=1), arrival_time=now - 5.0),
                    RequestSpec("future", [1, 2], SamplingParams(max_tokens=1), arrival_time=now + 60.0),
                    RequestSpec("none", [1, 2], SamplingParams(max_tokens=1))])
    taken = time.monotonic()
    assert e.requests["past"].arrival_time == now - 5.0
    assert now <= e.requests["future"].arrival_time <= taken and now <= e.requests["none"].arrival_time <= taken
    outputs = {o.request_id: o for o in e.step()}
    assert outputs["past"].metrics.first_token_time - outputs["past"].metrics.arrival_time >= 5.0
    # the queue-wait bound counts from the arrival too: received 5 s ago with 3 s to wait, behind
    # requests holding every slot (one holding a free slot is never refused), it is refused
    slots = e.config.scheduler.max_num_seqs
    e.add_requests([RequestSpec(f"hold{i}", [1, 2], SamplingParams(max_tokens=1)) for i in range(slots)]
                   + [RequestSpec("late", [1, 2], SamplingParams(max_tokens=1), max_queue_wait=3.0,
                                  arrival_time=time.monotonic() - 5.0)])
    assert {o.request_id: o.outputs[0].finish_reason for o in e.step()}.get("late") == "rejected"


def test_router_describes_its_replicas(router):
    one = router.engines[0].describe()
    assert one == EngineDescription(num_blocks=257, kv_cache="", replicas=1)
    assert router.describe() == EngineDescription(257, "2 replicas x ", 2)


def test_router_hands_out_one_grammar_engine_and_constraints_compile_off_the_engine_thread():
    """Behind the router, the API's worker thread compiles a request's constraint
    (`jaxinfer.entrypoints.openai.serving._compile_grammar`, no ``hasattr``): both replicas find it in their
    cache, so the engine thread (here: this one, adding and stepping) compiles nothing."""
    import threading

    from jaxinfer.entrypoints.openai.serving import _compile_grammar

    shared = SharedGrammar(tokenizer(), V, frozenset((EOS, EOS_B)))
    router = DataParallelRouter([fake_engine(grammar=shared), fake_engine(grammar=shared)])
    try:
        grammar = router.grammar_engine()
        assert grammar is router.engines[0].grammar_engine() is router.engines[1].grammar_engine()
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        params = SamplingParams(max_tokens=2, structured_outputs={"json": schema})
        worker = threading.Thread(target=_compile_grammar, args=(router, params))
        worker.start()
        worker.join()
        assert grammar.compilations == 1
        router.add_requests([RequestSpec(f"s{i}", [1, 2, 3], params) for i in range(2)])
        assert [e.num_waiting for e in router.engines] == [1, 1]  # one on each replica
        while router.has_unfinished_requests():
            router.step()
        assert grammar.compilations == 1
    finally:
        router.shutdown()


def test_a_grammar_without_a_tokenizer_refuses_structured_outputs():
    with pytest.raises(RequestError) as exc:
        SharedGrammar(None, V, frozenset((EOS,))).get()
    assert exc.value.param == "structured_outputs"
