"""`AsyncEngine`: one engine thread, commands through a queue, outputs via call_soon_threadsafe.

Over a fake-runner engine: outputs are hand-computable, runner.steps counts device work.
"""
from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from api_helpers import expected_ids, fake_engine
from fakes import FakeRunner
from jaxinfer.engine.async_engine import (AsyncEngine, EngineDeadError, EngineNotReadyError, EngineState, RequestSpec)
from jaxinfer.errors import RequestError
from jaxinfer.sampling_params import SamplingParams


def spec(rid, ids=(1000,), max_tokens=4, **kw):
    return RequestSpec(rid, list(ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True, **kw))


@pytest.fixture
def ae():
    a = AsyncEngine(fake_engine(max_queue_len=4)).start()
    assert a.ready_event.wait(10)
    yield a
    a.shutdown()


def test_generate_yields_cumulative_outputs(ae):
    async def run():
        return [o async for o in ae.generate(spec("a", max_tokens=5))]

    outs = asyncio.run(run())
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == expected_ids([1000], 5)
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    assert lengths == sorted(lengths) and not any(o.finished for o in outs[:-1])


def test_idle_thread_blocks_instead_of_polling(ae):
    proc = psutil.Process()
    cpu0 = sum(proc.cpu_times()[:2])
    time.sleep(1.0)
    assert sum(proc.cpu_times()[:2]) - cpu0 < 0.05  # no busy-wait, no 0.1 s polling loop


def test_group_is_all_or_nothing(ae):
    engine = ae.engine
    steps = engine.runner.steps

    async def run(specs):
        return await ae.add(specs)

    with pytest.raises(RequestError) as e:
        asyncio.run(run([spec("ok"), spec("bad", ids=[])]))
    assert e.value.param == "prompt"
    with pytest.raises(RequestError) as e:  # max_queue_len 4: a group of 5 can never be queued: 400, not 429
        asyncio.run(run([spec(f"q{i}") for i in range(5)]))
    assert e.value.param == "n"
    assert engine.num_waiting == engine.num_running == 0 and engine.runner.steps == steps
    assert engine.stats.prompt_tokens == 0


def test_abort_when_the_consumer_leaves(ae):
    ae.engine.runner.step_delay = 0.005  # 200 tokens take >= 1 s: the abort lands mid-generation

    async def run():
        gen = ae.generate(spec("long", max_tokens=200))
        first = await gen.__anext__()
        await gen.aclose()  # the consumer goes away
        return first

    asyncio.run(run())
    engine = ae.engine
    deadline = time.monotonic() + 2
    while engine.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.stats.aborted == 1 and engine.num_free_blocks == engine.num_total_blocks


def test_abort_while_queued_is_never_prefilled():
    engine = fake_engine(max_num_seqs=1, step_delay=0.005)
    ae = AsyncEngine(engine).start()
    ae.ready_event.wait(10)
    try:
        async def run():
            busy = await ae.add([spec("busy", max_tokens=50)])
            queued = await ae.add([spec("queued", ids=range(500, 600))])
            await asyncio.sleep(0.05)
            assert engine.num_waiting == 1
            ae.abort(["queued"])
            (out,) = await queued.next_batch()
            while not busy.finished:
                await busy.next_batch()
            return out

        out = asyncio.run(run())
        assert out.outputs[0].finish_reason == "abort" and out.outputs[0].token_ids == []
        assert engine.stats.prefill_tokens == 1  # only "busy"'s one prompt token was ever computed
    finally:
        ae.shutdown()


def test_not_ready_and_dead_states():
    class Boom(FakeRunner):
        def execute(self, inputs):
            raise RuntimeError("boom")

    ae = AsyncEngine(lambda: fake_engine(runner=Boom(49152)))
    with pytest.raises(EngineNotReadyError):
        ae.check_accepting()
    ae.start()
    ae.ready_event.wait(10)

    async def run():
        stream = await ae.add([spec("x")])
        with pytest.raises(EngineDeadError):
            await stream.next_batch()
        with pytest.raises(EngineDeadError):
            await ae.add([spec("y")])

    asyncio.run(run())
    assert ae.state == EngineState.DEAD and not ae.is_healthy and "boom" in ae.error
    ae.shutdown()


def test_builder_failure_is_reported_not_hung():
    def build():
        raise OSError("weights not found")

    ae = AsyncEngine(build).start()
    assert ae.ready_event.wait(5)
    assert ae.state == EngineState.DEAD and "weights not found" in ae.error
    with pytest.raises(EngineDeadError):
        ae.check_accepting()


def test_shutdown_aborts_in_flight_and_draining_refuses():
    ae = AsyncEngine(fake_engine(step_delay=0.005)).start()
    ae.ready_event.wait(10)

    async def run():
        stream = await ae.add([spec("long", max_tokens=200)])
        ae.start_draining()
        with pytest.raises(EngineNotReadyError):
            await ae.add([spec("late")])
        await asyncio.to_thread(ae.shutdown)
        last = None
        while not stream.finished:
            (last,) = await stream.next_batch()
        return last

    last = asyncio.run(run())
    assert last.outputs[0].finish_reason == "abort"
    assert ae.state == EngineState.STOPPED


def test_static_scheduler_batch_window_is_waited_out():
    """Nothing schedulable while the static scheduler collects a batch: the thread waits (bounded), then serves."""
    import dataclasses

    engine = fake_engine()
    sc = dataclasses.replace(engine.config.scheduler, scheduler="static", batch_timeout_s=0.2, max_num_seqs=4)
    from jaxinfer.engine.llm_engine import LLMEngine

    engine = LLMEngine(dataclasses.replace(engine.config, scheduler=sc), engine.model_config, FakeRunner(49152),
                       engine.block_manager.num_blocks, engine.tokenizer)
    ae = AsyncEngine(engine).start()
    ae.ready_event.wait(10)
    try:
        async def run():
            return [o async for o in ae.generate(spec("s", max_tokens=3))]

        t0 = time.monotonic()
        outs = asyncio.run(run())
        assert outs[-1].outputs[0].token_ids == expected_ids([1000], 3)
        assert 0.15 < time.monotonic() - t0 < 2.0  # one lone request waits for the batch window, then runs
    finally:
        ae.shutdown()


def test_unexpected_admission_error_fails_the_group_not_the_engine(ae, monkeypatch):
    """A bug while adding a group (not a RequestError) reaches that caller as the exception
    (HTTP 500 at the API); the engine thread lives on and serves the next request."""
    engine = ae.engine
    real = engine.add_requests
    calls = []

    def broken(specs):
        calls.append(1)
        if len(calls) == 1:
            real(specs[:1])  # half the group got in before the failure
            raise RuntimeError("admission bug")
        return real(specs)

    monkeypatch.setattr(engine, "add_requests", broken)

    async def run():
        with pytest.raises(RuntimeError):
            await ae.add([spec("x1"), spec("x2")])
        return [o async for o in ae.generate(spec("after", max_tokens=3))]

    outs = asyncio.run(run())
    assert outs[-1].finished and outs[-1].outputs[0].token_ids == expected_ids([1000], 3)
    assert engine.block_manager.num_used_blocks == 0  # x1 was aborted, "after" finished: nothing leaks
    assert "x1" not in engine.requests or engine.requests["x1"].is_finished
