"""int8 weights against float32 in the real decode step: what the compiled HLO dequantizes,
and interleaved timings of the whole step and of the LM head alone.

Loads the model twice in one process (float32, and float32 with ``quantization="int8"``;
the same KV pool, no warm-up), captures one real decode step of the float32 engine at 1
sequence (bucket T=1, R=1: the unrolled layer layout on CPU) and at 32 sequences (T=40,
R=32: the scanned layout), and compiles both engines' model steps for those buckets the
way the runner does (`jaxinfer.runner.model_runner.ModelRunner.compile`). Then:

  * ``hlo``: per engine and bucket, every instruction of the optimized HLO that reads an
    int8 (``s8``) array: the computation it is in (``while_body``: once per layer of the
    scanned stack), its kind (and custom-fusion kind), output type and the bytes it
    writes per execution; and the count of ``dot`` ops and YNNPACK fusions.
  * ``ms``: medians (and minima) of interleaved calls in this one process (every
    repetition calls each variant once, rotating the order, so load on the shared CPU
    hits all alike): each engine's model step per bucket, the step of the int8 engine
    with the tied LM head computed over the whole table at once (``HEAD_CHUNK = 0``, the
    path before the vocabulary-chunked head), and the LM head alone at R rows in each
    variant of `head_variants` on the captured final hidden states.
  * ``head_quality``: for each head variant, the largest logit difference from the float32
    head and the fraction of rows whose argmax equals the float32 head's.

Usage: python benchmarks/int8_probe.py [--reps 15] [--prompt-len 64] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's jaxinfer, not another installed copy

from jaxinfer.bench.metadata import git_commit  # noqa: E402

_ITEMSIZE = {"s8": 1, "u8": 1, "pred": 1, "bf16": 2, "f16": 2, "u16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8}
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.-]+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\((.*)$")
_COMP = re.compile(r"^(?:ENTRY )?%?([\w.-]+) .*\{\s*$")


def hlo_int8_readers(text: str) -> dict:
    """The instructions of optimized HLO ``text`` that take an ``s8`` operand (operands are
    printed by name: their types are looked up from their definitions).

    Returns:
      {"readers": [{computation, name, op, kind, out, operands, bytes_out}], "dots": n,
      "ynn_fusions": n} where ``bytes_out`` is what the instruction writes per execution.
    """
    lines, types = [], {}
    comp = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and " = " not in line.split("{")[0]:
            comp = m.group(1)
            continue
        m = _INSTR.match(line)
        if m:
            types[m.group(1)] = f"{m.group(2)}[{m.group(3)}]"
            lines.append((comp, m.groups()))
    readers, dots, ynn = [], 0, 0
    for comp, (name, dtype, dims, op, rest) in lines:
        dots += op == "dot"
        ynn += "__ynn_fusion" in rest
        if op in ("parameter", "get-tuple-element", "tuple", "bitcast", "while", "copy"):
            continue
        operands = [types.get(o, "?") for o in re.findall(r"%([\w.-]+)", rest.split("), ", 1)[0])]
        if not any(t.startswith("s8[") for t in operands):
            continue
        kind = re.search(r"kind=(\w+)", rest)
        custom = re.search(r'"kind":"(\w+)"', rest)
        readers.append({"computation": comp, "name": name, "op": op,
                        "kind": (kind.group(1) if kind else "") + (f"/{custom.group(1)}" if custom else ""),
                        "out": f"{dtype}[{dims}]", "operands": operands,
                        "bytes_out": math.prod(int(d) for d in dims.split(",") if d) * _ITEMSIZE.get(dtype, 4)})
    return {"readers": readers, "dots": dots, "ynn_fusions": ynn}


def summarize(h: dict) -> dict:
    """Per computation that is not itself a fusion body (the entry, a while body: the layer
    scan runs its body once per layer, the vocabulary loop once per chunk): the fusions
    reading int8 grouped by (kind, output type), with their count and bytes written."""
    groups = {}
    for r in h["readers"]:
        if r["op"] != "fusion" or r["computation"].startswith("fused_computation"):
            continue
        g = groups.setdefault(r["computation"], {}).setdefault(f'{r["kind"]} {r["out"]}', {"count": 0, "bytes": 0})
        g["count"] += 1
        g["bytes"] += r["bytes_out"]
    return {"dots": h["dots"], "ynn_fusions": h["ynn_fusions"], "int8_reading_fusions": groups}


def capture(llm, batch: int, prompt_len: int):
    """StepInputs of a decode step of ``llm`` where ``batch`` sequences all decode."""
    from jaxinfer import SamplingParams

    e, seen = llm.engine, []
    execute = e.runner.execute
    e.runner.execute = lambda inputs: (seen.append(inputs), execute(inputs))[1]
    rs = np.random.RandomState(batch)
    sp = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for i in range(batch):
        e.add_request(f"cap-{batch}-{i}", rs.randint(256, 16000, prompt_len).tolist(), sp)
    while e.has_unfinished_requests():
        e.step()
    e.runner.execute = execute
    return [s for s in seen if s.bucket.num_seqs == batch and s.bucket.num_tokens >= batch
            and s.bucket.num_tokens < 2 * batch + 8][-1]


def interleaved_ms(fns: dict, reps: int) -> dict:
    """`decode_probe.interleaved_ms` (median and min ms, rotating order), rounded to µs."""
    from decode_probe import interleaved_ms as measure  # a sibling script: benchmarks/ is on sys.path

    return {n: {k: round(v, 3) for k, v in t.items()} for n, t in measure(fns, reps).items()}


def head_variants(embed_q: dict, table32) -> dict:
    """name -> jitted ``f(hidden [R, D]) -> logits [R, V]`` float32 (tables bound as jit
    arguments, never constants)."""
    from jaxinfer.layers.quantization import int8 as quant

    q, s = embed_q["embedding"], embed_q["scale"]
    f32 = jax.jit(lambda t, h: jnp.einsum("rd,vd->rv", h, t, preferred_element_type=jnp.float32))
    whole = jax.jit(lambda q, s, h: quant.qdot(h, q, s, (1,), jnp.float32))
    w8a8 = jax.jit(lambda q, s, h: quant.qdot(h, q, s, (1,), jnp.float32, w8a8_min_rows=0))
    out = {"f32": lambda h: f32(table32, h), "int8_whole": lambda h: whole(q, s, h),
           "int8_w8a8": lambda h: w8a8(q, s, h)}
    for chunk in (1024, 2048):
        f = jax.jit(functools.partial(quant.tied_head_logits, chunk=chunk, dtype=jnp.float32))
        out[f"int8_chunk{chunk}"] = lambda h, f=f: f(h, q, s)

    def contiguous(q, s, h, c=1024):  # chunks of consecutive rows (the loop over the outer axis)
        n = q.shape[0] // c
        y = jax.lax.map(lambda ts: quant.qdot(h, ts[0], ts[1], (1,), jnp.float32),
                        (q.reshape(n, c, -1), s.reshape(n, c, -1)))
        return jnp.transpose(y, (1, 0, 2)).reshape(h.shape[0], -1)
    contig = jax.jit(contiguous)
    out["int8_contiguous1024"] = lambda h: contig(q, s, h)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--no-heads", action="store_true", help="skip the LM-head-alone variants")
    ap.add_argument("--hlo-dir", default=None, help="also write each optimized HLO text here")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import jaxinfer
    from jaxinfer import LLM
    from jaxinfer.runner.model_runner import ModelRunner
    from jaxinfer.layers.quantization import int8 as quant

    kw = dict(dtype="float32", max_model_len=1056, max_num_seqs=32, max_num_batched_tokens=512, num_blocks=400,
              warmup=False, use_tqdm=False, enable_prefix_caching=False)
    llms = {"f32": LLM(a.model, **kw), "int8": LLM(a.model, quantization="int8", **kw)}
    runners = {n: llm.engine.runner for n, llm in llms.items()}
    steps = {"r1": capture(llms["f32"], 1, a.prompt_len), "r32": capture(llms["f32"], 32, a.prompt_len)}
    caches = {n: [r.k_cache, r.v_cache] for n, r in runners.items()}
    fns, hlo, hidden = {}, {}, {}
    chunk_default = quant.HEAD_CHUNK

    def exe_of(runner, inputs, head_chunk=None):
        if head_chunk is None:
            runner.compile(inputs)
            return runner._executables[inputs.bucket]
        quant.HEAD_CHUNK = head_chunk  # read at trace time by QEmbed.attend
        try:
            jitted = runner._jitted_unrolled if runner._unrolled(inputs.bucket) else runner._jitted
            model = jitted.__wrapped__.args[0]  # a fresh function: a new trace under this HEAD_CHUNK
            step = jax.jit(functools.partial(ModelRunner._model_step, model), donate_argnums=(1, 2))
            spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
            return step.lower(jax.tree.map(spec, runner._step_params(inputs.bucket)), spec(runner.k_cache),
                              spec(runner.v_cache), *jax.device_put((inputs.token_ids, inputs.attention))).compile()
        finally:
            quant.HEAD_CHUNK = chunk_default

    for b, inputs in steps.items():
        dev = jax.device_put((inputs.token_ids, inputs.attention))
        variants = [("f32", None), ("int8", None)] + ([("int8", 0)] if chunk_default else [])
        for engine, chunk in variants:
            runner = runners[engine]
            exe = exe_of(runner, inputs, chunk)
            name = f"step_{engine}{'_whole_head' if chunk == 0 else ''}_{b}"
            text = exe.as_text()
            hlo[name] = hlo_int8_readers(text)
            if a.hlo_dir:
                Path(a.hlo_dir).mkdir(parents=True, exist_ok=True)
                (Path(a.hlo_dir) / f"{name}.hlo.txt").write_text(text)

            def call(exe=exe, engine=engine, params=runner._step_params(inputs.bucket), dev=dev, name=name):
                logits, _greedy_ids, k, v, h = exe(params, *caches[engine], *dev)  # `ModelRunner._model_step`
                caches[engine][:] = [k, v]
                hidden.setdefault(name, h[dev[1].logits_indices])
                return logits
            fns[name] = call
    if not a.no_heads:
        heads = head_variants(runners["int8"].params["embed"], runners["f32"].params["embed"]["embedding"])
        quality = {}
        for b in steps:
            jax.block_until_ready(fns[f"step_f32_{b}"]())
            h = hidden[f"step_f32_{b}"]
            ref = np.asarray(heads["f32"](h))
            for n, f in heads.items():
                fns[f"head_{n}_{b}"] = functools.partial(f, h)
                got = np.asarray(f(h))
                quality[f"{n}_{b}"] = {"max_abs_diff": float(np.abs(got - ref).max()),
                                       "argmax_equal": float(np.mean(got.argmax(-1) == ref.argmax(-1)))}
    ms = interleaved_ms(fns, a.reps)
    ratios = {b: ms[f"step_f32_{b}"]["median"] / ms[f"step_int8_{b}"]["median"] for b in steps}
    out = {"benchmark": "int8_probe", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "jaxinfer": jaxinfer.__file__, "git": git_commit(), "jax": jax.__version__, "model": a.model,
           "reps": a.reps, "head_chunk": chunk_default, "buckets": {b: str(s.bucket) for b, s in steps.items()},
           "ms": ms, "f32_over_int8_step": ratios, "hlo": hlo}
    if not a.no_heads:
        out["head_quality"] = quality
    out["hlo_summary"] = {name: summarize(h) for name, h in hlo.items()}
    print(json.dumps({k: v for k, v in out.items() if k != "hlo"}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
