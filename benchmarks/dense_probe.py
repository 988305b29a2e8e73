"""Dense-layer probe: what XLA on this device does for the model's own matmuls alone.

The decode step minus attention and the sampler: embeddings already gathered, then per
layer RMSNorm -> q/k/v projections -> o projection (fed the q heads instead of attention
output, same shape) -> residual -> RMSNorm -> SwiGLU MLP -> residual, then the final
norm and the LM head, with the same shapes and dtype as the model and float32
accumulation (as `jaxinfer.models.llama`). Its time is the floor the full decode step
is judged against (`benchmarks/roofline.py` records it as ``decode.dense_probe_ms``).

Layouts probed (weights are jit arguments, never closed-over constants, which XLA would
fold):
  * ``scan``: stacked [L, ...] weights under ``lax.scan``, separate q/k/v and gate/up
    (the model's layout);
  * ``scan_fused``: the same with one [D, (N+2K)H] q/k/v matmul and one [D, 2F] gate/up;
  * ``unrolled``: separate matmuls, one array per layer, a Python loop over layers (the
    model's ``scan_layers=False`` layout);
  * ``unrolled_fused``: the same with the fused matmuls;
  * ``scan_amx``: the layout a bfloat16 model runs on a CPU with AMX or AVX-512 BF16
    (`jaxinfer.kernels.cpu.amx`): the stacked weights packed once, every product (the LM head's
    too) by the packed-product kernel reading layer ``l`` in place. Needs AMX or AVX-512 BF16;
    elsewhere it is left out.

Usage: python benchmarks/dense_probe.py [--rows 1 32 64] [--reps 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.kernels.cpu import amx as native_amx
from jaxinfer.platform.cpu_features import host_cpu_flags
from jaxinfer.bench.metadata import git_commit
from jaxinfer.layers import cpu_bf16

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("scan", "scan_fused", "unrolled", "unrolled_fused", "scan_amx")


def _dot(x, w):  # the model's product (`cpu_bf16.dot_general`: one-row bfloat16 products as two rows on CPU)
    return cpu_bf16.dot_general(x, w, (((x.ndim - 1,), (0,)), ((), ())))


def _norm(x, eps=1e-5):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def make_weights(cfg, layout: str, dtype, seed: int = 0) -> dict:
    """Random weights of ``cfg``'s shapes in ``layout`` (numpy -> device arrays)."""
    D, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    NH, KH = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    rs = np.random.RandomState(seed)
    arr = lambda *s: jnp.asarray((rs.standard_normal(s) * 0.02).astype(np.float32), dtype)  # noqa: E731
    head = {"lm_head": arr(D, V)}
    if layout == "scan_amx":
        packed = lambda *s: jnp.asarray(native_amx.pack(np.asarray(arr(*s))))  # noqa: E731
        return {"lm_head": packed(1, D, V), "q": packed(L, D, NH), "k": packed(L, D, KH), "v": packed(L, D, KH),
                "o": packed(L, NH, D), "gate": packed(L, D, F), "up": packed(L, D, F), "down": packed(L, F, D)}
    if layout == "scan":
        return head | {"q": arr(L, D, NH), "k": arr(L, D, KH), "v": arr(L, D, KH), "o": arr(L, NH, D),
                       "gate": arr(L, D, F), "up": arr(L, D, F), "down": arr(L, F, D)}
    if layout == "scan_fused":
        return head | {"qkv": arr(L, D, NH + 2 * KH), "o": arr(L, NH, D), "gate_up": arr(L, D, 2 * F),
                       "down": arr(L, F, D)}
    if layout == "unrolled":
        layers = [{"q": arr(D, NH), "k": arr(D, KH), "v": arr(D, KH), "o": arr(NH, D), "gate": arr(D, F),
                   "up": arr(D, F), "down": arr(F, D)} for _ in range(L)]
    else:
        layers = [{"qkv": arr(D, NH + 2 * KH), "o": arr(NH, D), "gate_up": arr(D, 2 * F), "down": arr(F, D)}
                  for _ in range(L)]
    return head | {"layers": layers}


def _layer(x, w, NH: int, F: int, dtype, dot=_dot):
    h = _norm(x).astype(dtype)
    if "qkv" in w:
        q = dot(h, w["qkv"])[:, :NH]  # k, v feed attention, which the probe leaves out
    else:
        q, _, _ = dot(h, w["q"]), dot(h, w["k"]), dot(h, w["v"])
    x = x + dot(q.astype(dtype), w["o"])
    h = _norm(x).astype(dtype)
    if "gate_up" in w:
        gu = dot(h, w["gate_up"])
        g, u = gu[:, :F], gu[:, F:]
    else:
        g, u = dot(h, w["gate"]), dot(h, w["up"])
    return x + dot((jax.nn.silu(g) * u).astype(dtype), w["down"])


def make_forward(cfg, layout: str, dtype):
    """A jitted ``f(weights, x [M, D] float32) -> logits [M, V] float32``."""
    NH, F = cfg.num_attention_heads * cfg.head_dim, cfg.intermediate_size

    def forward(w, x):
        if layout == "scan_amx":
            body = lambda c, layer: (_layer(c, w, NH, F, dtype, lambda a, b: native_amx.matmul(a, b, layer)), None)  # noqa: E731
            x, _ = jax.lax.scan(body, x, jnp.arange(cfg.num_hidden_layers, dtype=jnp.int32))
            return native_amx.matmul(_norm(x).astype(dtype), w["lm_head"], 0)
        if layout.startswith("unrolled"):
            for lw in w["layers"]:
                x = _layer(x, lw, NH, F, dtype)
        else:
            stacked = {k: v for k, v in w.items() if k != "lm_head"}  # bit-stored bfloat16 on CPU, as the model
            x, _ = jax.lax.scan(lambda c, lw: (_layer(c, cpu_bf16.bits_as_bfloat16(lw), NH, F, dtype), None), x,
                                stacked)
        return _dot(_norm(x).astype(dtype), w["lm_head"])

    return jax.jit(forward)


def probe_ms(cfg, layout: str, rows: int, dtype, reps: int = 5) -> float:
    """Best-of-``reps`` milliseconds of the dense forward at ``rows`` tokens."""
    w = make_weights(cfg, layout, dtype)
    if layout.startswith("scan") and cpu_bf16.wants_bits(dtype, jax.default_backend()):
        w = {k: v if k == "lm_head" else cpu_bf16.weights_as_bits(v) for k, v in w.items()}
    f = make_forward(cfg, layout, dtype)
    x = jnp.asarray(np.random.RandomState(1).standard_normal((rows, cfg.hidden_size)).astype(np.float32))
    jax.block_until_ready(f(w, x))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(w, x))
        best = min(best, time.perf_counter() - t0)
    return 1e3 * best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2-135m.json"), help="HF config.json")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 64])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from jaxinfer.config import ModelConfig

    cfg = ModelConfig.from_dict(json.loads(Path(args.config).read_text()))
    dtype = jnp.dtype(args.dtype)
    layouts = [lay for lay in args.layouts if lay != "scan_amx" or (native_amx.available(host_cpu_flags()) and dtype == jnp.bfloat16)]
    res = {lay: {str(m): probe_ms(cfg, lay, m, dtype, args.reps) for m in args.rows} for lay in layouts}
    out = {"benchmark": "dense_probe", "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "device": str(jax.devices()[0]), "jax": jax.__version__, "dtype": args.dtype, "config": args.config,
           "git": git_commit(),
           "xla_flags": __import__("os").environ.get("XLA_FLAGS", ""), "ms": res}
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
