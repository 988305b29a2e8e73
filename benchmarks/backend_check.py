"""Engine-level check of the GPU attention backends (``pallas``: Triton; ``mosaic``: Mosaic
GPU) against ``xla`` on one device.

The GPU machine cannot receive the converted SmolLM2 weights (over the device tool's
64 MiB carry limit, and it has no network), so the oracle tests cannot run there. This
check is what replaces them on a GPU: the same engine, the same random weights (a
model config from ``configs/``, weights scaled up so that logits are not all near-ties),
the same prompts, once per backend, comparing

- the greedy tokens of every prompt (prompts of 1, 15, 16, 17, 33, 100 and 300 tokens plus
  one long enough to be prefilled in several chunks, all submitted in one call, so steps
  mix prefill chunks, continuing chunks and decodes);
- the logits of every generated step up to the first token where the backends part.
  They may part only at a near-tie (the xla top-2 gap below ``--tie-gap``), the rule
  the oracle tests use.

It also runs a decode-throughput probe per backend (``--decode-batch`` sequences, greedy,
``--decode-tokens`` each) and reports output tokens per second, so a GPU run shows
what the kernel buys at the engine level.

On CPU the kernels run in their interpreters (slow); use a small config there
(``tests/test_backend_check.py`` runs it on a tiny model). ``--backends`` picks the backends
compared with xla (default: pallas); a backend that cannot serve a dtype (mosaic: float32)
is reported as skipped with the plan's reason, not as a failure.

Usage:
  python benchmarks/backend_check.py                         # SmolLM2 layout, both dtypes
  python benchmarks/backend_check.py --config configs/llama-3-8b.json --layers 4 \
      --dtypes bfloat16 --backends pallas,mosaic --out DIR
Exit status 1 if any comparison fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_LENGTHS = (1, 15, 16, 17, 33, 100, 300)
# float32: XLA's dot and the kernel's accumulate in different orders; bfloat16 rounds
# the cache and the p @ V operand, so only the near-tie rule is meaningful there.
LOGIT_TOL = {"float32": 2e-3, "bfloat16": None}


@dataclasses.dataclass
class BackendRun:
    tokens: list[list[int]]
    logits: list[list[np.ndarray]]
    seconds: float


def make_prompts(vocab: int, long_len: int, seed: int = 0) -> list[list[int]]:
    """Random token ids (never special-looking 0..16) of the fixed lengths plus one long."""
    rng = np.random.default_rng(seed)
    lengths = [n for n in PROMPT_LENGTHS if n < long_len] + [long_len]
    return [rng.integers(17, vocab, size=n).tolist() for n in lengths]


def build_llm(model_config, params, backend: str, dtype: str, max_model_len: int, batch: int):
    from jaxinfer import LLM

    batch = max(batch, 16)
    return LLM("dummy", dtype=dtype, max_model_len=max_model_len, max_num_seqs=batch,
               max_num_batched_tokens=128, attention_backend=backend, warmup=False,
               return_logits=True, enable_prefix_caching=False,
               num_blocks=max(64, batch * (max_model_len // 16 + 1)),
               model_config=model_config, params=params, tokenizer=None)


def run_backend(llm, prompts, max_tokens: int) -> BackendRun:
    from jaxinfer import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    seconds = time.perf_counter() - start
    return BackendRun([o.outputs[0].token_ids for o in outs],
                      [o.outputs[0].logits for o in outs], seconds)


def compare(ref: BackendRun, got: BackendRun, dtype: str, tie_gap: float) -> dict:
    """Per prompt: steps compared, where tokens part, max |logit diff| before that."""
    rows, ok = [], True
    for i, (rt, gt) in enumerate(zip(ref.tokens, got.tokens)):
        n_same = next((j for j, (a, b) in enumerate(zip(rt, gt)) if a != b), len(rt))
        diffs = [float(np.max(np.abs(ref.logits[i][j] - got.logits[i][j])))
                 for j in range(min(n_same + 1, len(rt)))]
        scale = float(np.max(np.abs(ref.logits[i][0])))
        row = {"prompt": i, "same_tokens": n_same, "of": len(rt),
               "max_logit_diff": max(diffs), "logit_scale": scale}
        if n_same < len(rt):
            top = np.sort(ref.logits[i][n_same])[::-1]
            row["gap_at_split"] = float(top[0] - top[1])
            row["ok"] = row["gap_at_split"] < tie_gap
        else:
            row["ok"] = True
        tol = LOGIT_TOL[dtype]
        if tol is not None and n_same == len(rt):
            row["ok"] = row["ok"] and row["max_logit_diff"] <= tol * max(1.0, scale)
        ok = ok and row["ok"]
        rows.append(row)
    return {"ok": ok, "prompts": rows}


def decode_probe(llm, vocab: int, batch: int, tokens: int) -> dict:
    """Greedy decode of ``batch`` 32-token prompts, ``tokens`` each; second run timed."""
    from jaxinfer import SamplingParams

    rng = np.random.default_rng(1)
    prompts = [rng.integers(17, vocab, size=32).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)  # compiles the buckets
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"batch": batch, "tokens_each": tokens, "seconds": seconds,
            "output_tok_per_s": generated / seconds}


def unsupported(model_config, dtype: str, backend: str) -> str | None:
    """Why ``backend`` cannot serve this model in ``dtype`` (the plan's rule), or None."""
    if backend != "mosaic":
        return None
    from jaxinfer.layers.attention.mosaic import supports

    return supports(model_config.num_attention_heads, model_config.num_key_value_heads,
                    model_config.head_dim, 16, dtype)


def check_dtype(model_config, dtype: str, args) -> list[dict]:
    """One result per backend of ``--backends``: its run against the xla run of the same
    weights and prompts (``ok``, per prompt rows) and, with ``--decode-batch``, its throughput."""
    import jax

    from jaxinfer.models.params import init_params

    params = init_params(model_config, dtype, seed=0, scale=args.weight_scale)
    long_len = args.max_model_len - args.max_tokens - 1
    prompts = make_prompts(model_config.vocab_size, long_len)
    backends = [b for b in args.backends.split(",") if b]
    skipped = {b: why for b in backends if (why := unsupported(model_config, dtype, b))}
    runs, probes = {}, {}
    for backend in ["xla"] + [b for b in backends if b not in skipped]:
        llm = build_llm(model_config, params, backend, dtype, args.max_model_len, args.decode_batch)
        runs[backend] = run_backend(llm, prompts, args.max_tokens)
        if args.decode_batch:
            probes[backend] = decode_probe(llm, model_config.vocab_size, args.decode_batch,
                                           args.decode_tokens)
        del llm
        jax.clear_caches()
    results = []
    for backend in backends:
        if backend in skipped:
            results.append({"dtype": dtype, "backend": backend, "ok": True, "skipped": skipped[backend],
                            "prompts": []})
            continue
        result = compare(runs["xla"], runs[backend], dtype, args.tie_gap)
        result.update(dtype=dtype, backend=backend, prompt_lengths=[len(p) for p in prompts],
                      seconds={b: runs[b].seconds for b in ("xla", backend)},
                      decode={b: probes[b] for b in ("xla", backend) if b in probes})
        results.append(result)
    return results


def summary_lines(results: list[dict]) -> list[str]:
    lines = []
    for r in results:
        if r.get("skipped"):
            lines.append(f"{r['dtype']:9s} {r['backend']}: skipped ({r['skipped']})")
            continue
        worst = max(p["max_logit_diff"] for p in r["prompts"])
        same = sum(p["same_tokens"] for p in r["prompts"])
        total = sum(p["of"] for p in r["prompts"])
        line = (f"{r['dtype']:9s} {r['backend']} vs xla {'PASS' if r['ok'] else 'FAIL'}  tokens equal {same}/{total}"
                f"  max |logit diff| {worst:.2e}")
        for backend, probe in r["decode"].items():
            line += f"  {backend} decode {probe['output_tok_per_s']:.0f} tok/s"
        lines.append(line)
    return lines


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2-135m.json"),
                    help="model config JSON (HF keys)")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--backends", default="pallas", help="comma-separated backends compared with xla")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--weight-scale", type=float, default=4.0,
                    help="multiply the 0.02 init std (larger logit gaps)")
    ap.add_argument("--tie-gap", type=float, default=0.1)
    ap.add_argument("--float32-precision", default="highest",
                    help="jax.default_matmul_precision of the float32 runs ('default' for TF32 on a GPU)")
    ap.add_argument("--decode-batch", type=int, default=64, help="0 skips the probe")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--out", default=None, help="folder for backend_check[_TAG].json")
    ap.add_argument("--tag", default="", help="suffix of the JSON file name")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax

    from jaxinfer.entrypoints.plan import load_config

    model_config = load_config(args.config, args.layers or None)
    results = []
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": str(jax.devices()[0]), "jax": jax.__version__,
              "python": platform.python_version(), "config": args.config,
              "args": vars(args), "results": results}
    for dtype in args.dtypes.split(","):
        # float32 dots on a GPU default to TF32 (~1e-3 relative) in XLA's layers and attention,
        # while the kernel asks for HIGHEST: the 2e-3 logit bound compares full float32 only.
        precision = args.float32_precision if dtype == "float32" else None
        precision = None if precision == "default" else precision
        with jax.default_matmul_precision(precision):
            done = check_dtype(model_config, dtype, args)
        for r in done:
            r["matmul_precision"] = precision or "default"
        results.extend(done)
        print("\n".join(summary_lines(done)), flush=True)
        if args.out:  # after each dtype: a run cut short by a time limit keeps what it did
            out = pathlib.Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            name = f"backend_check_{args.tag}.json" if args.tag else "backend_check.json"
            (out / name).write_text(json.dumps(report, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
