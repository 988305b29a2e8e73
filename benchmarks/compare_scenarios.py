"""The serving comparison's scenario table: `Scenario` and `scenarios` (each scenario's clients,
workload and systems; ``--quick`` shrinks them), and what a scenario asks of a jaxinfer server's
sizing: `num_blocks` (one KV budget for every jaxinfer configuration) and `queue_limits`; and
`errors_by_kind` / `errors_markdown` / `defaults128_acceptance`, what compare.json and compare.md
say about failed requests and the design's headline scene (``defaults128``).

What each scenario measures is described in `compare.py`'s module docstring; `compare.py` runs
them. Plain Python (the load generator's `jaxinfer.bench.workloads`); no JAX import.
"""
from __future__ import annotations

import dataclasses
import math

from jaxinfer.bench import workloads


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One closed-loop scenario.

    Attributes:
      name: key in compare.json.
      clients: closed-loop clients (concurrent requests offered).
      pool_clients: requests of ``--input-len`` + ``--output-len`` tokens the shared jaxinfer
        KV pool holds, and the batch size of static batching / transformers (``clients``
        except for overload).
      workload: requests to send (lengths in tokens).
      systems: systems that run it (when selected).
      extra_body: fields added to every request of the scenario (structured outputs).
    """

    name: str
    clients: int
    pool_clients: int
    workload: workloads.WorkloadConfig
    systems: tuple[str, ...]
    extra_body: dict | None = None

    @property
    def server_defaults(self) -> bool:
        """jaxinfer runs with ``server.py``'s defaults only (no sizing, queue or tuning flags):
        the design's headline scene as a new user meets it (issue 50)."""
        return self.name in (DEFAULTS128, FLOOD)

    @property
    def same_kv_budget(self) -> bool:
        """Two jaxinfer configurations run it, so both get the same explicit ``--num-blocks``
        (with a fallback model: per model, the fallback's pool comes on top). Not with
        `server_defaults`: both modes keep the default pool."""
        return not self.server_defaults and ("jaxinfer-static" in self.systems or "jaxinfer-fallback" in self.systems)

    @property
    def overloaded(self) -> bool:
        """A short queue: excess clients get 429 (or, with a fallback, go there)."""
        return self.name in ("overload", "degradation")


DEFAULTS128 = "defaults128"  # the design's headline scene: 128 clients, 512 / 256, jaxinfer with server defaults
FLOOD = "flood1024"  # 8x the headline scene's clients on server defaults: fast 429s, nothing else (run when named)
SCENARIOS = ("single", "fixed8", "fixed", "sharegpt", "c128", DEFAULTS128, FLOOD, "overload", "priority", "priority-fcfs",
             "json8", "grounded1", "degradation", "sampled")
PRIORITY_SCENARIOS = ("priority", "priority-fcfs")  # the interactive / batch mix (benchmarks/priority_mix.py)
# the others run when named
DEFAULT_SCENARIOS = tuple(s for s in SCENARIOS if s not in ("grounded1", "degradation", "sampled", FLOOD))
FALLBACK_NAME = "fallback"  # the served name of the degradation scenario's fallback model
JSON8_MIN_ITEMS = 64
JSON8_SCHEMA = {"type": "object", "properties": {"rows": {
    "type": "array", "minItems": JSON8_MIN_ITEMS, "items": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 0}, "label": {"enum": ["red", "green", "blue"]},
        "note": {"type": "string", "maxLength": 24}}, "required": ["id", "label", "note"],
        "additionalProperties": False}}}, "required": ["rows"], "additionalProperties": False}


# the "sampled" scenario: fixed lengths drawn as OpenAI-style clients ask by default (temperature
# 1) with a nucleus, instead of the other scenarios' greedy requests
SAMPLED = {"temperature": 1.0, "top_p": 0.95}


def scenarios(a) -> dict[str, Scenario]:
    """The scenario table for the parsed arguments (``--quick`` shrinks clients and lengths)."""
    s = 8 if a.quick else 1  # quick: fewer clients
    fixed = dict(name="fixed", input_len=a.input_len, output_len=a.output_len, seed=a.seed)
    wl = workloads.WorkloadConfig
    sharegpt = wl(name="sharegpt", num_requests=a.num_requests, max_input_len=a.max_model_len // 2,
                  max_output_len=a.max_model_len // 2 - 1, seed=a.seed)
    c128 = max(128 // s, 1)
    table = [
        Scenario("single", 1, 1, wl(name="fixed", num_requests=a.single_requests, input_len=a.single_input_len,
                                    output_len=a.single_output_len, seed=a.seed),
                 ("jaxinfer", "jaxinfer-before", "llamacpp", "llamacpp-q8_0", "hf-transformers")),
        Scenario("fixed8", max(8 // s, 1), max(8 // s, 1), wl(num_requests=a.num_requests, **fixed),
                 ("jaxinfer", "jaxinfer-before", "llamacpp", "llamacpp-q8_0", "hf-transformers")),
        Scenario("fixed", a.concurrency, a.concurrency, wl(num_requests=a.num_requests, **fixed),
                 ("jaxinfer", "jaxinfer-static", "jaxinfer-before", "jaxinfer-spec", "llamacpp", "llamacpp-q8_0",
                  "hf-transformers")),
        Scenario("sampled", a.concurrency, a.concurrency, wl(num_requests=a.num_requests, **fixed),
                 ("jaxinfer", "jaxinfer-before", "llamacpp"), extra_body=SAMPLED),
        Scenario("sharegpt", a.concurrency, a.concurrency, sharegpt,
                 ("jaxinfer", "jaxinfer-static", "jaxinfer-before", "llamacpp", "hf-transformers")),
        Scenario("c128", c128, c128, wl(num_requests=max(a.num_requests, c128), **fixed),
                 ("jaxinfer", "jaxinfer-static")),
        Scenario(DEFAULTS128, c128, c128, wl(num_requests=max(a.num_requests, c128), **fixed),
                 ("jaxinfer", "jaxinfer-static", "llamacpp")),
        Scenario(FLOOD, 8 * c128, 8 * c128, wl(num_requests=8 * c128, **fixed), ("jaxinfer",)),
        Scenario("overload", 4 * a.concurrency, a.concurrency, wl(num_requests=2 * a.num_requests, **fixed),
                 ("jaxinfer", "jaxinfer-static")),
        Scenario("priority", 2 * a.concurrency, a.concurrency,
                 dataclasses.replace(sharegpt, num_requests=2 * a.num_requests), ("jaxinfer",)),
        Scenario("priority-fcfs", 2 * a.concurrency, a.concurrency,
                 dataclasses.replace(sharegpt, num_requests=2 * a.num_requests), ("jaxinfer",)),
        Scenario("json8", max(8 // s, 1), max(8 // s, 1), wl(num_requests=a.num_requests, **fixed), ("jaxinfer",),
                 extra_body={"structured_outputs": {"json": JSON8_SCHEMA}}),
        Scenario("grounded1", 1, 1, wl(name="input-grounded", num_requests=a.single_requests,
                                       input_len=a.grounded_input_len, output_len=a.grounded_output_len, seed=a.seed),
                 ("jaxinfer", "jaxinfer-spec")),
        Scenario("degradation", 4 * a.concurrency, a.concurrency, wl(
            name="fixed", num_requests=2 * a.num_requests, input_len=a.degradation_input_len,
            output_len=a.degradation_output_len, seed=a.seed), ("jaxinfer", "jaxinfer-fallback")),
    ]
    return {sc.name: sc for sc in table}


def num_blocks(scen: Scenario, a, block_size: int = 16) -> int:
    """KV pool blocks holding ``pool_clients`` requests of ``input_len + output_len`` tokens,
    + the null block (ShareGPT-like requests vary around that; the longest need more)."""
    return scen.pool_clients * math.ceil((a.input_len + a.output_len) / block_size) + 1


def queue_limits(scen: Scenario, a) -> tuple[int, float]:
    """(max queue length, max queue wait s). Every scenario but overload queues every client
    (nobody should be turned away at the designed load); overload keeps a short queue so
    excess clients get 429 + Retry-After at once, which keeps admitted requests' TTFT bounded."""
    if scen.overloaded:
        return a.overload_queue_len, a.max_queue_wait
    return max(a.max_queue_len, scen.clients), a.timeout_s


ERROR_KINDS = ("queue_full", "queue_wait_expired", "http_429_other", "http_4xx", "http_5xx", "client_timeout",
               "client_error", "stream_error")


def errors_by_kind(requests: list[dict]) -> dict[str, int]:
    """Failed requests of one run by kind: the 429's error ``code`` (``queue_full``: refused at
    arrival, ``queue_wait_expired``: refused after waiting), other 4xx, 5xx, the client's own
    time-out, connection and stream errors. ``requests``: a run's per-request dicts
    (`jaxinfer.bench.report.result_dict`; ``error`` holds the start of the error body)."""
    counts = dict.fromkeys(ERROR_KINDS, 0)
    for r in requests:
        outcome = r["outcome"]
        if outcome == "ok":
            continue
        if outcome == "http_429":
            code = next((c for c in ("queue_wait_expired", "queue_full") if c in (r.get("error") or "")), None)
            counts[code or "http_429_other"] += 1
        else:
            counts["client_timeout" if outcome == "timeout" else outcome] += 1
    return counts


def errors_markdown(result_scenarios: dict) -> str:
    """compare.md's "Errors by kind" table: every (scenario, system) with a failed request."""
    rows = [f"| {scen} | {name} | " + " | ".join(str(e["errors_by_kind"][k]) for k in ERROR_KINDS) + " |"
            for scen, systems in result_scenarios.items() for name, e in systems.items()
            if any((e.get("errors_by_kind") or {}).values())]
    if not rows:
        return "\n### Errors by kind\n\nNo request failed.\n"
    head = "| scenario | system | " + " | ".join(ERROR_KINDS) + " |"
    return "\n### Errors by kind\n\n" + "\n".join([head, "|" + "---|" * (len(ERROR_KINDS) + 2)] + rows) + "\n"


def flood_fields(requests: list[dict], metrics_after: dict | None) -> dict:
    """compare.json fields of a run for the flood's acceptance: 429s that carried no
    ``Retry-After``, and whether the KV pool was idle when the load ended (every usable block
    free; None when the server's metrics were not read)."""
    free = (metrics_after or {}).get("kv_blocks_free")  # as `jaxinfer.bench.metadata.parse_metrics` names them
    total = (metrics_after or {}).get("kv_blocks_total")
    return {"http_429_without_retry_after": sum(r["outcome"] == "http_429" and r.get("retry_after") is None
                                                for r in requests),
            "kv_idle_after": None if free is None or total is None else free == total}


def defaults128_acceptance(result_scenarios: dict) -> list[dict]:
    """Issue 50's lines for the headline scene (jaxinfer on server defaults): 0 failed requests,
    KV fragmentation <= 2%, output tok/s >= the 32-client (``fixed``) figure of the same run."""
    e = result_scenarios.get(DEFAULTS128, {}).get("jaxinfer")
    fixed = result_scenarios.get("fixed", {}).get("jaxinfer")
    errors = None if e is None else e["counts"]["total"] - e["counts"]["ok"]
    frag = None if e is None else e.get("kv_fragmentation")
    ratio = None if e is None or fixed is None or not fixed["output_throughput_tok_s"] else (
        e["output_throughput_tok_s"] / fixed["output_throughput_tok_s"])
    lines = [("headline scene, server defaults: 0 failed requests", "jaxinfer errors", "<= 0", errors, 0, "max"),
             ("headline scene, server defaults: KV fragmentation <= 2%", "jaxinfer kv_fragmentation", "<= 0.02",
              frag, 0.02, "max"),
             ("headline scene, server defaults: output tok/s >= 32 clients'", "defaults128/fixed output_throughput",
              ">= 1", ratio, 1.0, "min")]
    out = [{"line": text, "scenario": DEFAULTS128, "quantity": qty, "target": target, "value": v,
            "pass": None if v is None else (v >= t if kind == "min" else v <= t)}
           for text, qty, target, v, t, kind in lines]
    return out + _flood_acceptance(result_scenarios.get(FLOOD, {}).get("jaxinfer"))


def _flood_acceptance(e: dict | None) -> list[dict]:
    """Issue 50's flood lines: every request answered or refused with 429 + Retry-After (no
    5xx, no client time-out or connection error), the KV pool idle after."""
    kinds = (e or {}).get("errors_by_kind")
    bad = None if kinds is None else (kinds["http_5xx"] + kinds["client_timeout"] + kinds["client_error"]
                                      + kinds["stream_error"] + kinds["http_4xx"]
                                      + e.get("http_429_without_retry_after", 0))
    idle = None if e is None else e.get("kv_idle_after")
    return [{"line": "flood (1,024 clients): no 5xx, time-out or 429 without Retry-After", "scenario": FLOOD,
             "quantity": "jaxinfer other failures", "target": "<= 0", "value": bad,
             "pass": None if bad is None else bad == 0},
            {"line": "flood (1,024 clients): KV pool idle after", "scenario": FLOOD,
             "quantity": "jaxinfer kv_idle_after", "target": "= 1", "value": None if idle is None else int(idle),
             "pass": idle}]
