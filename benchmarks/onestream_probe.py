"""One lone stream's decode step, end to end: where its time goes, in one process.

Serves one greedy request on the real model with `LLM` (float32, the server's default
ladders: max_model_len 4096, 32 sequences, 512 batched tokens; a small KV pool, which a
one-row step does not read beyond its own blocks; no warm-up: the buckets used compile on
first use) at a context of about ``--prompt-len`` tokens, then measures:

  1. ``engine``: ``--steps`` decode steps through `LLMEngine.step`, split into the engine's
     phases (`LLMEngine.stats.phase_seconds`), the update's detokenization (its text step),
     and the runner's call split by timers around ``jax.device_put`` (host->device copies
     of the step's inputs), each executable's call (dispatch) and ``jax.device_get`` (the
     wait for the results, device->host). Every other step blocks after each executable
     instead (``sync`` split: what the model and the sampler executables take to run);
  2. ``engine_ab``: ``--ab-steps`` more steps alternating one by one between this commit's
     settings and the earlier ones (``jax.device_put`` of the inputs, the sampler executable
     on every step; ``--before-groups``: B1 context groups per loop iteration at one row),
     each with its own compiled decode step;
  3. ``pieces``: compiled pieces of that decode step timed interleaved (each repetition
     calls every piece once, in rotating order; medians): the model executable as the
     runner runs it; the same without attention (K/V write kept); the dense-only probe at
     1 row (`dense_probe`'s unrolled layers + LM head: no attention, no sampler, no
     embedding gather); the LM head alone; the sampler alone; the copies of the step's
     inputs; ``ModelRunner.execute``, without its greedy fast path, and without that and its
     direct numpy inputs (the earlier runner); and the model
     step with B1 attention reading at least G context groups per loop iteration for each
     G of ``--groups`` (inputs prepared and the step compiled with
     `jaxinfer.layers.attention.xla_work_plan.MIN_GROUPS_PER_ITER` = G), with the largest logit difference from the
     runner's own step;
  4. ``async``: requests of ``--async-tokens`` tokens through `AsyncEngine` (the server's
     engine thread and its asyncio hand-off; no HTTP): per-token interval seen on the event
     loop against the engine's own ``step`` time, and the engine thread's time between steps.
Writes JSON to ``--out`` (and stdout).

Usage: python benchmarks/onestream_probe.py [--prompt-len 160] [--steps 40] [--reps 30] [--out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from decode_probe import compile_step, interleaved_ms, no_attention  # benchmarks/ is on sys.path as a script
from dense_probe import make_forward, make_weights
from jaxinfer.bench.metadata import git_commit


def med_ms(xs) -> float:
    return 1e3 * statistics.median(xs) if xs else float("nan")


class StepTimers:
    """Wraps ``jax.device_put`` / ``jax.device_get`` and the runner's executables with timers;
    ``sync`` makes each executable call block until its results are ready."""

    def __init__(self, runner):
        self.runner = runner
        self.sync = False
        self.t: dict[str, list[float]] = {}
        self._put, self._get = jax.device_put, jax.device_get
        self._exes = dict(runner._executables), dict(runner._samplers)

    def _add(self, name, dt):
        self.t.setdefault(name, []).append(dt)

    def _wrap(self, name, fn):
        def call(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            if self.sync and name in ("model", "sampler"):
                jax.block_until_ready(out)
            self._add(f"{name}{'_sync' if self.sync and name in ('model', 'sampler') else ''}",
                      time.perf_counter() - t0)
            return out
        return call

    def __enter__(self):
        jax.device_put = self._wrap("device_put", self._put)
        jax.device_get = self._wrap("device_get", self._get)
        r = self.runner
        r._executables = {b: self._wrap("model", f) for b, f in self._exes[0].items()}
        r._samplers = {k: self._wrap("sampler", f) for k, f in self._exes[1].items()}
        return self

    def __exit__(self, *exc):
        jax.device_put, jax.device_get = self._put, self._get
        self.runner._executables, self.runner._samplers = self._exes


def engine_breakdown(e, steps: int) -> dict:
    """Decode ``steps`` steps of the one running request; per-step milliseconds by phase."""
    detok = []
    text_stop = e.output_processor.text_stop

    def timed_text_stop(req):
        t0 = time.perf_counter()
        out = text_stop(req)
        detok.append(time.perf_counter() - t0)
        return out

    e.output_processor.text_stop = timed_text_stop
    phases0 = dict(e.stats.phase_seconds)
    step_times = {False: [], True: []}
    with StepTimers(e.runner) as timers:
        for i in range(steps):
            timers.sync = bool(i % 2)
            t0 = time.perf_counter()
            e.step()
            step_times[timers.sync].append(time.perf_counter() - t0)
    del e.output_processor.text_stop  # the method again
    phases = {k: 1e3 * (v - phases0[k]) / steps for k, v in e.stats.phase_seconds.items()}
    host = phases["schedule"] + phases["prepare"] + phases["mask"] + phases["update"]
    return {"step_ms_median": med_ms(step_times[False]), "step_ms_median_sync_split": med_ms(step_times[True]),
            "phase_ms_mean": phases, "detokenize_ms_median": med_ms(detok),
            "runner_ms_median": {k: med_ms(v) for k, v in timers.t.items()},
            "host_ms_mean": host, "host_share": host / sum(phases.values())}


def engine_ab(e, steps: int, before_groups: int) -> dict:
    """`LLMEngine.step` alternating, step by step, between this commit's settings and the
    ones before it (B1 reading `before_groups` context groups per loop iteration, no greedy
    fast path), each with its own compiled decode step; per-step milliseconds."""
    from jaxinfer.runner import model_runner as MR
    from jaxinfer.layers.attention import xla_work_plan as XW

    runner = e.runner
    orig = runner._executables
    configs = {"before": (before_groups, False, False),
               "after": (XW.MIN_GROUPS_PER_ITER, runner.greedy_fast_path, MR.HOST_INPUTS_DIRECT)}
    exes = {}

    def use(name):
        XW.MIN_GROUPS_PER_ITER, runner.greedy_fast_path, MR.HOST_INPUTS_DIRECT = configs[name]
        runner._executables = exes.setdefault(name, {})

    for name in configs:  # compile each configuration's decode bucket (one untimed step each)
        use(name)
        e.step()
    times = {n: [] for n in configs}
    for i in range(steps):
        name = ("before", "after")[i % 2]
        use(name)
        t0 = time.perf_counter()
        e.step()
        times[name].append(time.perf_counter() - t0)
    use("after")
    runner._executables = {**orig, **exes["after"]}
    b, a = med_ms(times["before"]), med_ms(times["after"])
    keys = ("min_groups_per_iter", "greedy_fast_path", "host_inputs_direct")
    return {"before_settings": dict(zip(keys, configs["before"])), "after_settings": dict(zip(keys, configs["after"])),
            "step_ms_median": {"before": b, "after": a}, "before_over_after": b / a,
            "steps_each": steps // 2}


def last_row(req):
    """A decode row of ``req``'s last computed token (its blocks exist; rerunning it rewrites
    the same K/V)."""
    from jaxinfer.runner.batch import Row

    start = req.num_computed_tokens - 1
    return Row(req, start, [req.all_token_ids[start]])


def pieces(e, req, args) -> dict:
    """Interleaved medians of the compiled pieces of ``req``'s next decode step (module docstring)."""
    from jaxinfer.runner import batch as B
    from jaxinfer.layers.attention import xla_work_plan as XW
    from jaxinfer.runner.model_runner import _sampler_key
    from jaxinfer.models import llama

    runner, cfg = e.runner, e.model_config
    row = last_row(req)
    inputs = B.prepare_rows([row], e.layout)
    params = runner._step_params(inputs.bucket)
    make = lambda: llama.LlamaForCausalLM(cfg, runner.model.attention, runner.dtype, runner.dtype,  # noqa: E731
                                          scan_layers=not runner._unrolled(inputs.bucket), linear=runner.linear)
    model_a = jax.device_put((inputs.token_ids, inputs.attention))
    exes, model_args, compile_s = {}, {}, {}
    exes["step"], compile_s["step"] = compile_step(runner, make(), params, model_a)
    model_args["step"] = model_a
    real = llama.paged_attention
    llama.paged_attention = no_attention
    try:
        exes["step_no_attn"], compile_s["step_no_attn"] = compile_step(runner, make(), params, model_a)
        model_args["step_no_attn"] = model_a
    finally:
        llama.paged_attention = real
    min_groups = XW.MIN_GROUPS_PER_ITER
    try:
        for g in args.groups:
            XW.MIN_GROUPS_PER_ITER = g
            inp = B.prepare_rows([row], e.layout)
            a = jax.device_put((inp.token_ids, inp.attention))
            exes[f"step_groups_{g}"], compile_s[f"step_groups_{g}"] = compile_step(runner, make(), params, a)
            model_args[f"step_groups_{g}"] = a
    finally:
        XW.MIN_GROUPS_PER_ITER = min_groups
    logits = {}

    def run(n):
        def call():
            out, runner.k_cache, runner.v_cache = exes[n](params, runner.k_cache, runner.v_cache, *model_args[n])
            logits[n] = out
            return out
        return call

    fns = {n: run(n) for n in exes}
    w = make_weights(cfg, "unrolled", runner.dtype)
    dense = make_forward(cfg, "unrolled", runner.dtype)
    x = jax.device_put(np.ones((1, cfg.hidden_size), np.float32))
    fns["dense_probe_1row"] = lambda: dense(w, x)
    head = llama.LMHead(cfg, runner.dtype, runner.dtype, linear=runner.head.linear)
    head_fn = jax.jit(lambda p, h: head.apply({"params": p}, h))
    head_params = runner._head_params(runner.params)
    fns["lm_head"] = lambda: head_fn(head_params, x)
    if cfg.tie_word_embeddings and cfg.quantization is None:  # the tied table [V, D] as the dot's left operand
        vr_fn = jax.jit(lambda p, h: jax.lax.dot_general(p["embed"]["embedding"], h, (((1,), (1,)), ((), ())),
                                                         preferred_element_type=jnp.float32).T)
        fns["lm_head_vr"] = lambda: vr_fn(head_params, x)
    sampler = runner._samplers[_sampler_key(inputs.bucket.num_seqs, inputs.sampling)]
    sample_a = jax.device_put(inputs.sampling)
    step_logits = jax.device_put(np.zeros((1, cfg.vocab_size), np.float32))
    fns["sampler"] = lambda: sampler(step_logits, sample_a)
    fns["device_put_inputs"] = lambda: jax.device_put((inputs.token_ids, inputs.attention, inputs.sampling))
    fns["execute"] = lambda: runner.execute(inputs)

    def execute_with_sampler():  # the same call without the greedy fast path
        runner.greedy_fast_path = False
        try:
            return runner.execute(inputs)
        finally:
            runner.greedy_fast_path = True

    fns["execute_with_sampler"] = execute_with_sampler

    def execute_before():  # ... and with jax.device_put of the inputs too (the earlier runner)
        from jaxinfer.runner import model_runner as MR

        runner.greedy_fast_path, MR.HOST_INPUTS_DIRECT = False, False
        try:
            return runner.execute(inputs)
        finally:
            runner.greedy_fast_path, MR.HOST_INPUTS_DIRECT = True, True

    fns["execute_before"] = execute_before
    ms = interleaved_ms(fns, args.reps)
    ref = np.asarray(logits["step"])
    if "lm_head_vr" in fns:
        a, b = np.asarray(fns["lm_head"]()), np.asarray(fns["lm_head_vr"]())
        lm_head_vr_diff = float(np.max(np.abs(a - b)))
    else:
        lm_head_vr_diff = None
    diffs = {n: float(np.max(np.abs(np.asarray(v) - ref))) for n, v in logits.items() if n.startswith("step_groups")}
    argmax_same = {n: bool(np.argmax(np.asarray(v)) == np.argmax(ref)) for n, v in logits.items()
                   if n.startswith("step_groups")}
    return {"bucket": str(inputs.bucket), "context": row.start, "interleaved_ms": ms, "compile_s": compile_s,
            "num_groups_used": num_groups_used(inputs, e.layout.block_size), "runner_min_groups_per_iter": min_groups,
            "max_abs_logit_diff_vs_step": diffs,
            "lm_head_vr_max_abs_diff": lm_head_vr_diff, "argmax_same_as_step": argmax_same}


def num_groups_used(inputs, block_size: int) -> int:
    """B1 context groups the step's XLA work plan uses (derived as the model step does)."""
    from jaxinfer.layers.attention.xla_work_plan import plan_xla_work

    return int(plan_xla_work(inputs.attention, block_size).num_groups)


def async_layer(e, prompt: list[int], tokens: int, requests: int) -> dict:
    """Per-token interval on the event loop vs the engine's step time, through `AsyncEngine`."""
    from jaxinfer import SamplingParams
    from jaxinfer.engine.async_engine import AsyncEngine, RequestSpec

    steps, gaps = [], []
    step = e.step
    last_end = [None]

    def timed_step():
        t0 = time.perf_counter()
        if last_end[0] is not None:
            gaps.append(t0 - last_end[0])
        out = step()
        last_end[0] = time.perf_counter()
        steps.append(last_end[0] - t0)
        return out

    e.step = timed_step
    ae = AsyncEngine(e, log_requests=False).start()
    ae.ready_event.wait()
    intervals = []

    async def one(i: int):
        last = None
        sp = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
        async for _ in ae.generate(RequestSpec(f"async-{i}", prompt, sp)):
            now = time.perf_counter()
            if last is not None:
                intervals.append(now - last)
            last = now

    async def main():
        for i in range(requests):
            last_end[0] = None  # the engine is idle between requests: no gap across them
            await one(i)

    asyncio.run(main())
    ae.shutdown()
    e.step = step
    return {"token_interval_ms_median": med_ms(intervals), "engine_step_ms_median": med_ms(steps),
            "per_token_overhead_ms": med_ms(intervals) - med_ms(steps),
            "engine_thread_gap_between_steps_ms_median": med_ms(gaps), "tokens": len(intervals)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompt-len", type=int, default=160, help="the context stays within one width bucket (256)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ab-steps", type=int, default=48, help="engine_ab: steps in all, half per setting")
    ap.add_argument("--before-groups", type=int, default=1, help="engine_ab: the B1 floor before this commit")
    ap.add_argument("--after-groups", type=int, default=None, help="the B1 floor to run with (default: the module's)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--groups", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--async-tokens", type=int, default=64)
    ap.add_argument("--async-requests", type=int, default=3)
    ap.add_argument("--num-blocks", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.layers.attention import xla_work_plan as XW

    if args.after_groups is not None:
        XW.MIN_GROUPS_PER_ITER = args.after_groups
    llm = LLM(args.model, dtype="float32", num_blocks=args.num_blocks, warmup=False, use_tqdm=False)
    e = llm.engine
    prompt = np.random.RandomState(0).randint(256, 16000, args.prompt_len).tolist()
    e.add_request("lone", prompt, SamplingParams(temperature=0.0, max_tokens=args.steps + args.ab_steps + 16,
                                                 ignore_eos=True))
    req = e.requests["lone"]
    while req.num_output_tokens < 4:  # prefill, then the first decode steps compile
        e.step()
    eng = engine_breakdown(e, args.steps)
    ab = engine_ab(e, args.ab_steps, args.before_groups)
    pcs = pieces(e, req, args)
    e.abort_request("lone")
    e.step()
    asy = async_layer(e, prompt, args.async_tokens, args.async_requests)
    out = {"benchmark": "onestream_probe", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": str(jax.devices()[0]), "jax": jax.__version__, "model": args.model, "git": git_commit(),
           "xla_flags": os.environ.get("XLA_FLAGS", ""), "prompt_len": args.prompt_len,
           "engine": eng, "engine_ab": ab, "pieces": pcs, "async": asy}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
