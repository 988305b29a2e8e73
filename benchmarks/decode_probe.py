"""Where a lone stream's decode step goes (1 token, 1 row), and what the layer layout gives.

Serves one greedy request on the real model with `LLM` (no warm-up; buckets compile on
first use), captures the inputs of one of its decode steps (T = 1, R = 1, the context
of a ``--prompt-len`` prompt), then times compiled pieces of that step in one process,
interleaved (each repetition calls every variant once, in rotating order; medians):

  * ``step_scan``: the model step as the runner compiles it (``nn.scan`` over stacked layers);
  * ``step_unrolled``: the same step with one module and one set of arrays per layer
    (`jaxinfer.models.layer_layout.unstack_layers`, split once before timing);
  * ``*_no_attn``: both, with paged attention replaced by its K/V write alone (the
    attention's share is the difference);
  * ``lm_head``: the LM head alone on one hidden row (tied: ``[1, D] x [V, D]``), and
    ``lm_head_dv``: the same against a transposed ``[D, V]`` copy of the table;
    ``sampler``: the sampler alone;
  * ``dense_unrolled`` / ``dense_unrolled_fused``: `dense_probe`'s dense layers at one row
    with separate q/k/v and gate/up matmuls against fused ones (per-layer arrays both);
  * ``execute``: ``ModelRunner.execute`` as the engine calls it (transfers, model step,
    sampler, read-back), with the runner's current layout.
Then it decodes ``--decode-steps`` tokens through ``LLMEngine.step`` and reports the
engine's per-phase milliseconds (schedule / prepare / execute / update). Compile times of
both layouts are measured on the same inputs with an empty compilation cache (a fresh
temporary directory), and the two layouts' logits are compared. ``--warmup-widths``
also compiles, in both layouts, every one-token bucket that a server with the default
ladders warms up (one per context width): the warm-up cost of unrolling them.

The probe compares layouts of XLA's own products, so it turns the AMX kernel off
(``JAXINFER_NATIVE_AMX=0`` unless set): with it on, the runner holds the layer kernels only
in their packed copy (`jaxinfer.layers.linear_methods.packed.without_packed`).

Usage: python benchmarks/decode_probe.py [--prompt-len 128] [--reps 30] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dense_probe import make_forward, make_weights  # benchmarks/ is on sys.path when run as a script
from jaxinfer.bench.metadata import git_commit

ROOT = Path(__file__).resolve().parents[1]


def capture_decode(llm, prompt_len: int):
    """(StepInputs of the request's second decode step, engine) after serving its prompt."""
    from jaxinfer import SamplingParams

    e = llm.engine
    seen = []
    execute = e.runner.execute

    def spy(inputs):
        seen.append(inputs)
        return execute(inputs)

    e.runner.execute = spy
    prompt = np.random.RandomState(0).randint(256, 16000, prompt_len).tolist()
    e.add_request("probe", prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while e.has_unfinished_requests():
        e.step()
    e.runner.execute = execute
    decodes = [s for s in seen if s.bucket.num_tokens == 1]
    return decodes[1]


def compile_step(runner, model, params, model_a):
    """(executable of ``model``'s step over ``params``, compile seconds); ``model_a`` is the
    step's ``(token_ids, AttentionMetadata)`` on device."""
    def step(params, k_cache, v_cache, token_ids, meta):
        return model.apply({"params": params}, token_ids, meta, k_cache, v_cache, meta.logits_indices)

    t0 = time.perf_counter()
    exe = jax.jit(step, donate_argnums=(1, 2)).lower(params, runner.k_cache, runner.v_cache, *model_a).compile()
    return exe, time.perf_counter() - t0


def no_attention(backend, q, k_new, v_new, k_cache, v_cache, layer, meta, sm_scale, window=None, plan=None):
    """`paged_attention` without the attention: the K/V write only, q passed through."""
    from jaxinfer.layers.attention.kv_storage import write_kv

    return q, write_kv(k_cache, layer, meta.slot_mapping, k_new), write_kv(v_cache, layer, meta.slot_mapping, v_new)


def interleaved_ms(fns: dict, reps: int) -> dict:
    """Median ms of each zero-argument callable; every repetition calls all of them once,
    starting one further along the list each time."""
    names = list(fns)
    times = {n: [] for n in names}
    for n in names:
        jax.block_until_ready(fns[n]())
    for r in range(reps):
        for j in range(len(names)):
            n = names[(r + j) % len(names)]
            t0 = time.perf_counter()
            jax.block_until_ready(fns[n]())
            times[n].append(time.perf_counter() - t0)
    return {n: {"median": 1e3 * statistics.median(t), "min": 1e3 * min(t)} for n, t in times.items()}


def warmup_widths(e, runner, make, stacked, unrolled) -> dict:
    """Cold compile seconds of the one-token model step at every context width of the default
    ladders (`jaxinfer.config.SchedulerConfig` defaults), scanned and unrolled."""
    from jaxinfer.runner import batch as B
    from jaxinfer.runner.buckets import Bucket, BucketLadders
    from jaxinfer.config import SchedulerConfig
    sc = SchedulerConfig()
    ladders = BucketLadders(sc.max_num_batched_tokens, sc.max_num_seqs, -(-sc.max_model_len // e.layout.block_size))
    secs = {"scan": {}, "unrolled": {}}
    for w in ladders.width_ladder:
        inp = B.empty_inputs(Bucket(1, 1, w), e.layout, penalties=False)
        for name, scan, params in (("scan", True, stacked), ("unrolled", False, unrolled)):
            secs[name][str(w)] = compile_step(runner, make(scan), params,
                                              jax.device_put((inp.token_ids, inp.attention)))[1]
    return {"widths": ladders.width_ladder, "compile_s": secs,
            "total_s": {k: sum(v.values()) for k, v in secs.items()},
            "default_buckets": len(ladders.all_buckets())}


def main() -> None:
    os.environ.setdefault("JAXINFER_NATIVE_AMX", "0")  # module docstring: the stacked kernels must stay
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--warmup-widths", action="store_true", help="compile all default one-token buckets")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from jaxinfer import LLM
    from jaxinfer.models import llama
    from jaxinfer.models.layer_layout import unstack_layers
    from jaxinfer.runner.model_runner import _sampler_key

    cache_dir = tempfile.mkdtemp(prefix="decode-probe-xla-")  # cold compiles, not disk-cache hits
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    llm = LLM(args.model, max_model_len=1024, max_num_seqs=1, num_blocks=160, warmup=False, use_tqdm=False)
    e, runner, cfg = llm.engine, llm.engine.runner, llm.engine.model_config
    inputs = capture_decode(llm, args.prompt_len)
    model_a = jax.device_put((inputs.token_ids, inputs.attention))
    sample_a = jax.device_put(inputs.sampling)
    stacked, unrolled = runner.params, runner.layer_params  # the runner keeps the stacked tree too
    if unrolled is None:  # a runner that scans every bucket
        unrolled = unstack_layers(stacked, cfg.num_hidden_layers)
    make = lambda scan: llama.LlamaForCausalLM(cfg, runner.model.attention, runner.dtype, runner.dtype,  # noqa: E731
                                               scan_layers=scan, linear=runner.linear)
    exes, compile_s = {}, {}
    for name, scan, params in (("step_scan", True, stacked), ("step_unrolled", False, unrolled)):
        exes[name], compile_s[name] = compile_step(runner, make(scan), params, model_a)
    real = llama.paged_attention
    llama.paged_attention = no_attention
    try:
        for name, scan, params in (("step_scan_no_attn", True, stacked), ("step_unrolled_no_attn", False, unrolled)):
            exes[name], _ = compile_step(runner, make(scan), params, model_a)
    finally:
        llama.paged_attention = real
    params_of = {n: (stacked if "scan" in n else unrolled) for n in exes}
    caches = {n: (jnp.copy(runner.k_cache), jnp.copy(runner.v_cache)) for n in exes}
    logits = {}

    def run_step(n):
        def call():
            out, k, v = exes[n](params_of[n], *caches[n], *model_a)
            caches[n] = (k, v)
            logits[n] = out
            return out
        return call

    fns = {n: run_step(n) for n in exes}
    head = llama.LMHead(cfg, runner.dtype, runner.dtype, linear=runner.head.linear)
    head_params = runner._head_params(stacked)
    hidden = jnp.ones((1, cfg.hidden_size), jnp.float32)
    head_fn = jax.jit(lambda p, h: head.apply({"params": p}, h))
    fns["lm_head"] = lambda: head_fn(head_params, hidden)
    if cfg.tie_word_embeddings and cfg.quantization is None:
        table_dv = jnp.asarray(np.ascontiguousarray(np.asarray(head_params["embed"]["embedding"]).T))
        dv_fn = jax.jit(lambda t, h: jnp.einsum("rd,dv->rv", h.astype(t.dtype), t, preferred_element_type=jnp.float32))
        fns["lm_head_dv"] = lambda: dv_fn(table_dv, hidden)
    key = _sampler_key(inputs.bucket.num_seqs, inputs.sampling)
    sampler = runner._samplers[key]
    step_logits = jnp.zeros((1, cfg.vocab_size), jnp.float32)
    fns["sampler"] = lambda: sampler(step_logits, sample_a)
    for layout in ("unrolled", "unrolled_fused"):
        w = make_weights(cfg, layout, runner.dtype)
        f = make_forward(cfg, layout, runner.dtype)
        x = jnp.ones((1, cfg.hidden_size), jnp.float32)
        fns[f"dense_{layout}"] = lambda f=f, w=w, x=x: f(w, x)
    fns["execute"] = lambda: runner.execute(inputs)
    ms = interleaved_ms(fns, args.reps)
    same_cache = {n: (jnp.copy(runner.k_cache), jnp.copy(runner.v_cache)) for n in ("step_scan", "step_unrolled")}
    ref = {n: np.asarray(exes[n](params_of[n], *same_cache[n], *model_a)[0]) for n in same_cache}
    diff = float(np.max(np.abs(ref["step_scan"] - ref["step_unrolled"])))

    e.stats.phase_seconds.update(dict.fromkeys(e.stats.phase_seconds, 0.0))
    from jaxinfer import SamplingParams

    prompt = np.random.RandomState(1).randint(256, 16000, args.prompt_len).tolist()
    e.add_request("phases", prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    while e.has_unfinished_requests():
        e.step()
    e.add_request("phases2", prompt, SamplingParams(temperature=0.0, max_tokens=args.decode_steps + 1,
                                                    ignore_eos=True))
    e.step()  # its prefill (prefix cache hit) and first token
    e.stats.phase_seconds.update(dict.fromkeys(e.stats.phase_seconds, 0.0))
    times = []
    while e.has_unfinished_requests():
        t0 = time.perf_counter()
        e.step()
        times.append(time.perf_counter() - t0)
    phases = {k: 1e3 * v / len(times) for k, v in e.stats.phase_seconds.items()}

    out = {"benchmark": "decode_probe", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": str(jax.devices()[0]), "jax": jax.__version__, "model": args.model, "dtype": str(runner.dtype),
           "git": git_commit(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
           "prompt_len": args.prompt_len, "bucket": str(inputs.bucket), "reps": args.reps,
           "runner_unroll_max_tokens": runner.unroll_max_tokens,
           "interleaved_ms": ms, "compile_s": compile_s, "max_abs_logit_diff_scan_vs_unrolled": diff,
           "engine_step_ms_median": 1e3 * statistics.median(times), "engine_phase_ms_per_step": phases,
           "speedup_unrolled": ms["step_scan"]["median"] / ms["step_unrolled"]["median"]}
    if args.warmup_widths:
        out["warmup_one_token_buckets"] = warmup_widths(e, runner, make, stacked, unrolled)
    shutil.rmtree(cache_dir, ignore_errors=True)
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
