"""Per-step host cost of the structured-output token mask, llguidance vs xgrammar.

For ``--rows`` constrained rows (each its own matcher over a nested JSON schema, driven by
a fixed valid JSON text tokenized with SmolLM2's tokenizer), times filling the
``[rows, ceil(vocab/32)]`` int32 bitmask once per step, then advancing each matcher by
one token, over the whole text; also the one-time grammar compile. xgrammar is measured
only when it can be imported (it is not a dependency). Prints one JSON line per engine.

    python benchmarks/grammar_mask.py --rows 1 8 32
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "pets": {"type": "array", "items": {"type": "object", "properties": {
        "kind": {"enum": ["cat", "dog"]}, "legs": {"type": "integer"}}, "required": ["kind", "legs"]}}},
    "required": ["name", "age", "role", "pets"], "additionalProperties": False}
TEXT = json.dumps({"name": "Ada Lovelace", "age": 36, "role": "admin",
                   "pets": [{"kind": "cat", "legs": 4}, {"kind": "dog", "legs": 3}] * 4}, separators=(",", ":"))


def _stats(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"mean_us": 1e6 * statistics.fmean(s), "p50_us": 1e6 * s[len(s) // 2], "p95_us": 1e6 * s[int(.95 * len(s))]}


def bench_llguidance(tok, vocab: int, rows: int, ids: list[int]) -> dict:
    from jaxinfer.structured_outputs.grammar import GrammarEngine
    from jaxinfer.structured_outputs.params import StructuredOutputsParams

    g = GrammarEngine(tok, vocab, {tok.eos_token_id})
    c = StructuredOutputsParams(json=SCHEMA)
    t0 = time.perf_counter()
    g.matcher(c)
    compile_s = time.perf_counter() - t0
    matchers = [g.matcher(c) for _ in range(rows)]
    mask = np.full((rows, (vocab + 31) // 32), -1, np.int32)
    fills = []
    for t in ids:
        t0 = time.perf_counter()
        g.fill_bitmask([(m, i) for i, m in enumerate(matchers)], mask)
        fills.append(time.perf_counter() - t0)
        for m in matchers:
            assert m.consume_token(t), m.get_error()
    return {"engine": "llguidance", "rows": rows, "compile_ms": 1e3 * compile_s, "steps": len(ids), **_stats(fills)}


def bench_xgrammar(tok, vocab: int, rows: int, ids: list[int]) -> dict | None:
    try:
        import xgrammar as xgr
    except ImportError:
        return None
    info = xgr.TokenizerInfo.from_huggingface(tok._tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info)
    t0 = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":"))
    compile_s = time.perf_counter() - t0
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(rows)]
    mask = xgr.allocate_token_bitmask(rows, vocab)
    fills = []
    for t in ids:
        t0 = time.perf_counter()
        for i, m in enumerate(matchers):
            m.fill_next_token_bitmask(mask, i)
        fills.append(time.perf_counter() - t0)
        for m in matchers:
            assert m.accept_token(t)
    return {"engine": "xgrammar", "rows": rows, "compile_ms": 1e3 * compile_s, "steps": len(ids), **_stats(fills)}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    p.add_argument("--weights", default=str(HERE.parent / "weights" / "smollm2-135m-instruct"))
    a = p.parse_args(argv)
    from jaxinfer.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(a.weights)
    vocab = tok.vocab_size
    ids = tok.encode(TEXT, add_special_tokens=False)
    out = []
    for rows in a.rows:
        for bench in (bench_llguidance, bench_xgrammar):
            r = bench(tok, vocab, rows, ids)
            if r is not None:
                print(json.dumps(r), flush=True)
                out.append(r)
    return out


if __name__ == "__main__":
    main()
