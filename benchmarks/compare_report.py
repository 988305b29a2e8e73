"""What a serving comparison concludes: ratios between systems, the acceptance lines
(pass / FAIL / not measured) and ``compare.md``, from ``compare.json``'s scenarios.

Split from `compare.py` (which runs the servers and the load): everything here is a pure
function of the measured entries. Plain Python; no JAX import.
"""
from __future__ import annotations

from jaxinfer.bench import report

BUSY_CPU = 0.25  # compare.md flags runs that started while other work used more of the CPU than this


def _ratio(num, den) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def pair_ratios(a: dict, b: dict) -> dict:
    """``a`` over ``b`` (compare.json entries): output tok/s, TTFT p99, TPOT p50 (None where missing)."""
    return {"output_throughput": _ratio(a["output_throughput_tok_s"], b["output_throughput_tok_s"]),
            "ttft_p99": _ratio(a["ttft_ms"]["p99"], b["ttft_ms"]["p99"]),
            "tpot_p50": _ratio(a["tpot_ms"]["p50"], b["tpot_ms"]["p50"])}


RATIO_PAIRS = (("jaxinfer", "llamacpp"), ("jaxinfer", "jaxinfer-static"), ("jaxinfer", "jaxinfer-before"),
               ("jaxinfer", "hf-transformers"), ("jaxinfer-before", "llamacpp-q8_0"), ("jaxinfer", "llamacpp-q8_0"),
               ("jaxinfer-before", "llamacpp"))


def ratios(result_scenarios: dict) -> dict:
    """``{scenario: {"jaxinfer/<other>": pair_ratios}}`` for every pair in `RATIO_PAIRS` both
    measured, and for the priority mix (`priority_ratios`)."""
    out = {}
    for scen, systems in result_scenarios.items():
        pairs = {f"{x}/{y}": pair_ratios(systems[x], systems[y]) for x, y in RATIO_PAIRS
                 if x in systems and y in systems}
        if pairs:
            out[scen] = pairs
    prio = priority_ratios(result_scenarios)
    if prio:
        out.setdefault("priority", {}).update(prio)
    return out


def priority_ratios(result_scenarios: dict) -> dict:
    """The priority mix's pairs: ``interactive/batch`` (the two classes of the priority
    run), ``priority/fcfs`` (the priority run over the same mix under FCFS) and, per
    class, ``priority/fcfs <class>``, each `pair_ratios`; only those measured."""
    prio = result_scenarios.get("priority", {}).get("jaxinfer")
    fcfs = result_scenarios.get("priority-fcfs", {}).get("jaxinfer")
    out = {}
    if prio is not None and "classes" in prio:
        out["interactive/batch"] = pair_ratios(prio["classes"]["interactive"], prio["classes"]["batch"])
    if prio is not None and fcfs is not None:
        out["priority/fcfs"] = pair_ratios(prio, fcfs)
        if "classes" in prio and "classes" in fcfs:  # what the policy did for each class
            for cls in prio["classes"]:
                out[f"priority/fcfs {cls}"] = pair_ratios(prio["classes"][cls], fcfs["classes"][cls])
    return out


# (text, scenario, pair or None, quantity, "min"/"max", target)
ACCEPTANCE = (
    ("32 clients, 512/256: >= 1.5x llama.cpp output tok/s", "fixed", "jaxinfer/llamacpp", "output_throughput",
     "min", 1.5),
    ("32 clients, 512/256: <= 0.5x llama.cpp TTFT p99", "fixed", "jaxinfer/llamacpp", "ttft_p99", "max", 0.5),
    ("8 clients, 512/256: >= 1.3x llama.cpp output tok/s", "fixed8", "jaxinfer/llamacpp", "output_throughput",
     "min", 1.3),
    ("1 client, 128/128: TPOT p50 <= llama.cpp's", "single", "jaxinfer/llamacpp", "tpot_p50", "max", 1.0),
    ("fixed lengths: continuous >= 1.1x static output tok/s", "fixed", "jaxinfer/jaxinfer-static",
     "output_throughput", "min", 1.1),
    ("fixed lengths: continuous TTFT p99 <= 1/3 of static", "fixed", "jaxinfer/jaxinfer-static", "ttft_p99",
     "max", 1 / 3),
    ("ShareGPT-like lengths: continuous >= 2x static output tok/s", "sharegpt", "jaxinfer/jaxinfer-static",
     "output_throughput", "min", 2.0),
    ("ShareGPT-like lengths: continuous TTFT p99 <= 1/3 of static", "sharegpt", "jaxinfer/jaxinfer-static",
     "ttft_p99", "max", 1 / 3),
    ("128 clients: 0 failed requests (continuous)", "c128", None, "errors", "max", 0),
    ("128 clients: KV fragmentation <= 2% (continuous)", "c128", None, "kv_fragmentation", "max", 0.02),
    ("priority mix: interactive TTFT p99 <= 1/3 of batch", "priority", "interactive/batch", "ttft_p99", "max", 1 / 3),
    ("priority mix: output tok/s >= 0.95x FCFS on the same mix", "priority", "priority/fcfs", "output_throughput",
     "min", 0.95),
)


def acceptance(result_scenarios: dict, result_ratios: dict) -> list[dict]:
    """Each `ACCEPTANCE` line with its measured value and ``pass``: True / False, or None when
    not measured (system or scenario not run). Single-system lines read jaxinfer's entry;
    the degradation lines follow (`degradation_acceptance`)."""
    out = []
    for text, scen, pair, qty, kind, target in ACCEPTANCE:
        if pair is not None:
            value = result_ratios.get(scen, {}).get(pair, {}).get(qty)
        else:
            e = result_scenarios.get(scen, {}).get("jaxinfer")
            value = None if e is None else (e["counts"]["total"] - e["counts"]["ok"] if qty == "errors" else e[qty])
        ok = None if value is None else (value >= target if kind == "min" else value <= target)
        out.append({"line": text, "scenario": scen, "quantity": f"{pair} {qty}" if pair else f"jaxinfer {qty}",
                    "target": f"{'>=' if kind == 'min' else '<='} {target:.3g}", "value": value, "pass": ok})
    return out + degradation_acceptance(result_scenarios)


def degradation_acceptance(result_scenarios: dict) -> list[dict]:
    """The degradation scenario's lines (issue 14), from its two entries and the SLO they
    record (``ttft_slo_s``): with the fallback, 0 requests refused (anything but a 200
    counts) and TTFT p99 / SLO <= 1; without it, the same load is an overload: requests
    refused, or TTFT p99 / SLO > 1. None where not measured."""
    runs = result_scenarios.get("degradation", {})
    alone, fb = runs.get("jaxinfer"), runs.get("jaxinfer-fallback")

    def refused(e):
        return None if e is None else e["counts"]["total"] - e["counts"]["ok"]

    def over_slo(e):
        return None if e is None else e["ttft_ms"]["p99"] / 1000 / e["ttft_slo_s"]

    def line(text, quantity, target, value, ok):
        return {"line": text, "scenario": "degradation", "quantity": quantity, "target": target, "value": value,
                "pass": None if value is None else ok}

    fb_refused, fb_over, al_refused, al_over = refused(fb), over_slo(fb), refused(alone), over_slo(alone)
    return [line("degradation, with the fallback: 0 requests refused", "jaxinfer-fallback refused", "<= 0",
                 fb_refused, fb_refused == 0),
            line("degradation, with the fallback: TTFT p99 within the SLO", "jaxinfer-fallback TTFT p99 / SLO",
                 "<= 1", fb_over, fb_over is not None and fb_over <= 1),
            line("degradation, without: the same load gives refusals (or TTFT p99 over the SLO)",
                 "jaxinfer refused (TTFT p99 / SLO > 1 also passes)", "> 0", al_refused,
                 al_refused is not None and (al_refused > 0 or al_over > 1))]


def fallback_share(metrics_text: str, fallback_name: str = "fallback") -> float | None:
    """The share of the requests a jaxinfer server finished (stop or length) that its
    ``fallback_name`` model answered, from its ``GET /metrics`` text (None before any finished)."""
    from prometheus_client.parser import text_string_to_metric_families

    served = {}
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == "jaxinfer_request_success_total" and s.labels.get("finished_reason") in ("stop", "length"):
                served[s.labels["model_name"]] = served.get(s.labels["model_name"], 0) + s.value
    total = sum(served.values())
    return served.get(fallback_name, 0) / total if total else None


def _fmt(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def compare_markdown(result: dict) -> str:
    """The README tables: one section per scenario (one row per system), then ratios and acceptance."""
    m = result["metadata"]
    md = [f"Measured {m['date']} on {m['host']['cpu']} ({m['host']['cpu_count']} cores), commit "
          f"{(m['git']['commit'] or 'unknown')[:10]}.\n"]
    if m.get("quick"):
        md.append("Smoke run (--quick): tiny counts and lengths; the ratios below mean nothing.\n")
    if m.get("scaled_down"):
        s = m["scaled_down"]
        md.append(f"Scaled down: {s['num_requests']} requests per scenario instead of {s['target_num_requests']}: "
                  f"{s['why']}.\n")
    if (m.get("llamacpp") or {}).get("available") is False:
        md.append(f"llama.cpp not measured: {m['llamacpp']['reason']}\n")
    busy = [f"{scen}-{name} ({e['cpu_busy_before']:.0%})" for scen, systems in result["scenarios"].items()
            for name, e in systems.items() if (e.get("cpu_busy_before") or 0) > BUSY_CPU]
    if busy:
        md.append(f"Other work was using the CPU just before these runs (share of all cores busy): {', '.join(busy)}; "
                  "their numbers are not comparable (llama.cpp's spinning thread pool slows down many-fold "
                  "when it shares its cores).\n")
    for scen, systems in result["scenarios"].items():
        md.append(f"\n### {scen}\n\n")
        rows = [(f"{name} (c={e['concurrency']})", _as_summary(e)) for name, e in systems.items()]
        rows += [(f"{name} {cls} (priority {c['priority']}, c={c['concurrency']})", _as_summary(c))
                 for name, e in systems.items() for cls, c in e.get("classes", {}).items()]
        md.append(report.markdown_table(rows))
        for name, e in systems.items():
            if e.get("fallback_share") is not None:
                md.append(f"\n{name}: {e['fallback_share']:.0%} of the finished requests were answered by the "
                          "fallback model.\n")
    if result.get("ratios"):
        md.append("\n### Ratios (first system over second)\n\n"
                  "| scenario | pair | output tok/s | TTFT p99 | TPOT p50 |\n|---|---|---|---|---|\n")
        for scen, pairs in result["ratios"].items():
            for pair, r in pairs.items():
                md.append(f"| {scen} | {pair} | {_fmt(r['output_throughput'])} | {_fmt(r['ttft_p99'])} "
                          f"| {_fmt(r['tpot_p50'])} |\n")
    if result.get("acceptance"):
        md.append("\n### Acceptance\n\n| line | target | measured | result |\n|---|---|---|---|\n")
        for line in result["acceptance"]:
            verdict = {True: "pass", False: "FAIL", None: "not measured"}[line["pass"]]
            md.append(f"| {line['line']} | {line['target']} | {_fmt(line['value'], '.3g')} | {verdict} |\n")
    return "".join(md)


def _as_summary(e: dict) -> dict:
    """A compare.json entry in the shape `report.markdown_table` reads."""
    return {**e, "completed": e["counts"]["ok"]}
