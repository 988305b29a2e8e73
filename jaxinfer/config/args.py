"""The engine's flags, spelled once (vLLM's ``EngineArgs`` idea): one table, `FLAGS`.

Owns the table of ``server.py``'s flags (name, type, default, choices, help, group, and the
`EngineConfig` field or `LLM` keyword each one sets), `DEFAULT_MODEL`, `parse_bytes` (the
one reading of a memory size on every command line), `add_engine_args` (the flags of some
groups onto a parser: ``server.py``, ``python -m jaxinfer.plan``), `llm_defaults` (the
defaults of `jaxinfer.entrypoints.llm.LLM`'s keywords) and `engine_config` / `parallel_config` (flags ->
configuration, for ``server.py`` and `LLM` alike). The cluster launcher checks its
pass-through flags with ``server.py``'s parser, built here. Plain Python: no JAX import.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any, Callable, Iterable

from jaxinfer.core.sched.registry import SCHEDULING_POLICIES
from jaxinfer.pooling_params import POOLING_TYPES, RUNNERS, parse_pooling_type
from jaxinfer.reasoning import PARSERS
from jaxinfer.config import (ATTENTION_BACKENDS, BLOCK_SIZE, BLOCK_SIZES, DEFAULT_GPU_MEMORY_UTILIZATION, DTYPES,
                             KV_CACHE_DTYPES, QUANTIZATIONS, CacheConfig, EngineConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig)

DEFAULT_MODEL = "smollm2-135m-instruct"  # the model served when none is named (fetched on first use)

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


class SizeError(ValueError, argparse.ArgumentTypeError):
    """Not a memory size. A `ValueError`, and argparse's `ArgumentTypeError` so that a flag
    typed with `parse_bytes` fails with this message."""


def parse_bytes(text: str) -> int:
    """A memory size in bytes, in powers of 1024: ``"GB"``, ``"GiB"`` and ``"G"`` all mean
    2**30 (so ``"80GB"`` is 80 * 2**30 = 85,899,345,920 bytes), likewise k, M and T; a plain
    number is bytes. ``"2GiB"``, ``"512M"``, ``"1.5 MiB"``, ``"1073741824"``.

    Args:
      text: a number (decimals allowed) and an optional unit k/M/G/T, each optionally
        followed by ``i`` and then ``B`` (case-insensitive).
    Returns:
      The size in bytes (int, rounded down).
    Raises:
      SizeError: ``text`` is not such a size (a ValueError and an argparse.ArgumentTypeError).
    """
    m = _SIZE.match(text)
    if not m:
        raise SizeError(f"not a size: {text!r} (e.g. 2GiB, 512MiB, 1073741824)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))


@dataclasses.dataclass(frozen=True)
class Flag:
    """One engine flag.

    Attributes:
      name: the option, ``"--max-num-seqs"`` (its argparse ``dest``: `dest`).
      group: a key of `GROUPS` (the ``--help`` section).
      type, default, choices, help, action, metavar: as ``argparse.add_argument`` takes them
        (``action="bool"``: ``argparse.BooleanOptionalAction``, ``--x`` / ``--no-x``).
      field: the `EngineConfig` field it sets, dotted for a sub-config (``"cache.block_size"``),
        or None (a server setting, or one handled by name: model, speculative config).
      llm: the `jaxinfer.entrypoints.llm.LLM` keyword that takes it, or None (server only).
    """

    name: str
    group: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    choices: tuple | None = None
    help: str = ""
    action: str | None = None
    metavar: str | None = None
    field: str | None = None
    llm: str | None = None

    @property
    def dest(self) -> str:
        return self.name[2:].replace("-", "_")

    def add_to(self, parser, **overrides) -> None:
        """Add this flag to ``parser`` (a parser or an argument group); ``overrides`` replace
        ``add_argument`` keywords (another default or help text for another tool)."""
        kw = dict(type=self.type, default=self.default, choices=self.choices, help=self.help,
                  action=argparse.BooleanOptionalAction if self.action == "bool" else self.action,
                  metavar=self.metavar)
        kw.update(overrides)
        parser.add_argument(self.name, **{k: v for k, v in kw.items() if v is not None or k == "default"})


GROUPS = {"model": "model", "cache": "KV cache", "scheduler": "scheduler",
          "parallel": "parallelism (docs/distributed.md)", "server": "server",
          "advanced": "advanced (benchmarks and debugging)"}
ENGINE_GROUPS = ("model", "cache", "scheduler", "parallel", "advanced")  # all but the HTTP server's

_F = Flag
FLAGS: tuple[Flag, ...] = (
    _F("--model", "model", action="append", llm="model", help=(
        "name under weights/, a converted folder, a HF checkpoint folder or a .gguf file; repeat it to serve several "
        f"models, each with its own engine and KV pool (default: {DEFAULT_MODEL})")),
    _F("--served-model-name", "model", action="append", help=(
        "name clients send as `model`; repeat it to name each --model in order (default: the --model value)")),
    _F("--fallback-model", "model", help=(
        "model that takes requests whose estimated time to first token exceeds --degrade-ttft-slo: a served name, "
        "or another model to load and serve under this name (default: none, no degradation)")),
    _F("--degrade-ttft-slo", "model", type=float,
       help="time-to-first-token target in seconds for --fallback-model (default: none)"),
    _F("--tokenizer", "model", field="tokenizer", llm="tokenizer", help=(
        "folder (or name under weights/) to load the tokenizer and chat template from (default: the model's folder)")),
    _F("--chat-template", "model", action="append", metavar="FILE", field="chat_template", llm="chat_template", help=(
        "chat template for /v1/chat/completions, replacing the tokenizer's: a Jinja file, a bundled name (gemma3) "
        "or the template text; models without one (pretrained base models such as gemma3-270m) answer chat "
        "requests with 400 (default: the tokenizer's); repeatable, paired with --model by position")),
    _F("--dtype", "model", default="auto", choices=DTYPES, field="dtype", llm="dtype", help=(
        "weights, activations and KV cache; auto: bfloat16 on GPU/TPU and on CPUs with AVX-512 BF16 or AMX, "
        "else float32")),
    _F("--quantization", "model", choices=QUANTIZATIONS, field="quantization", llm="quantization", help=(
        "int8: weights quantized to int8 with group scales (one per 64 inputs) as they load "
        "(docs/quantization.md; default: none)")),
    _F("--runner", "model", default="generate", choices=RUNNERS, field="runner", llm="runner", help=(
        "generate: text generation (/v1/completions, /v1/chat/completions); pooling: embeddings "
        "(/v1/embeddings, LLM.embed) from the final hidden states, prefill only; each refuses the other's "
        "endpoints with 400 (vLLM's --runner)")),
    _F("--pooling-type", "model", type=str.lower, default="last", choices=POOLING_TYPES, field="pooling_type",
       llm="pooling_type", help=(
           "--runner pooling: last: the last prompt token's final hidden state (decoder embedding models); "
           "mean: their mean over the prompt; the vector is L2-normalized (vLLM: --pooler-config "
           "'{\"pooling_type\": \"MEAN\"}', also accepted here)")),
    _F("--pooler-config", "model", metavar="JSON", help=(
        "vLLM's spelling of --pooling-type: '{\"pooling_type\": \"MEAN\"}' (other keys are refused); "
        "overrides --pooling-type (default: none)")),
    _F("--attention-backend", "model", choices=tuple(ATTENTION_BACKENDS), field="attention_backend",
       llm="attention_backend", help="default: mosaic on GPUs of compute capability 9.0+ where it serves the model "
            "(docs/kernels.md), pallas (Triton) on other GPUs, xla elsewhere"),
    _F("--seed", "model", type=int, default=0, field="seed", llm="seed", help="seed of requests that give none"),
    _F("--reasoning-parser", "model", choices=PARSERS, field="reasoning_parser", llm="reasoning_parser", help=(
        "split the model's <think>...</think> reasoning into message.reasoning_content (and reasoning; streamed as "
        "delta.reasoning_content) with vLLM's parser of that name; structured outputs and tool calls apply to the "
        "answer after the reasoning (default: none, reasoning stays in the content)")),
    _F("--max-logprobs", "model", type=int, default=20, field="max_logprobs",
       help="largest top logprobs a request may ask for"),
    _F("--gpu-memory-utilization", "cache", type=float, field="cache.gpu_memory_utilization",
       llm="gpu_memory_utilization", help=(
           "fraction of device memory for weights, activations and KV cache together; does not apply on CPU "
           f"(default: {DEFAULT_GPU_MEMORY_UTILIZATION}; on CPU the KV budget is 4 GiB, at most a quarter of RAM)")),
    _F("--kv-cache-memory", "cache", type=parse_bytes, field="cache.kv_cache_memory", llm="kv_cache_memory",
       help="KV budget per device, e.g. 2GiB (default: from --gpu-memory-utilization)"),
    _F("--num-blocks", "cache", type=int, field="cache.num_blocks", llm="num_blocks",
       help="explicit KV pool size, overrides the budgets (default: from the budget)"),
    _F("--block-size", "cache", type=int, default=BLOCK_SIZE, choices=BLOCK_SIZES, field="cache.block_size",
       llm="block_size", help="tokens per KV block"),
    _F("--kv-cache-dtype", "cache", default="auto", choices=KV_CACHE_DTYPES, field="cache.kv_cache_dtype",
       llm="kv_cache_dtype", help=(
           "auto: the model dtype; int8 / fp8 (e4m3): 8-bit K/V with a scale per token and KV head, about twice "
           "the blocks of bfloat16 in the same budget (docs/quantization.md)")),
    _F("--watermark", "cache", type=float, default=0.15, field="cache.watermark", llm="watermark",
       help="fraction of blocks kept free at admission"),
    _F("--prefix-caching", "cache", default=True, action="bool", field="cache.enable_prefix_caching",
       llm="enable_prefix_caching",
       help="reuse KV blocks of shared prompt prefixes (--no-prefix-caching turns it off)"),
    _F("--max-model-len", "scheduler", type=int, field="scheduler.max_model_len", llm="max_model_len",
       help="prompt + output tokens (default: min(4096, model context))"),
    _F("--max-num-seqs", "scheduler", type=int, field="scheduler.max_num_seqs", llm="max_num_seqs",
       help="sequences running at once (sequence slots; default: 128, static batching 32, or "
            "--max-num-batched-tokens if smaller)"),
    _F("--max-num-batched-tokens", "scheduler", type=int, default=512, field="scheduler.max_num_batched_tokens",
       llm="max_num_batched_tokens", help="tokens per step (prefill + decode)"),
    _F("--prefill-budget-while-decoding", "scheduler", type=int, field="scheduler.prefill_budget_while_decoding",
       help=("cap on prompt tokens in a step that also decodes, so running streams keep their inter-token latency "
             "(default: none, only --max-num-batched-tokens; 96 kept ITL p99 within 2x a decode step on a 2-core "
             "CPU at 32 streams, for a later first token)")),
    _F("--speculative-config", "scheduler", metavar="JSON", llm="speculative_config", help=(
        "speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
        "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' (docs/speculative_decoding.md; default: off)")),
    _F("--max-queue-len", "scheduler", type=int, default=256, field="scheduler.max_queue_len", llm="max_queue_len",
       help="requests waiting beyond the free sequence slots (--max-num-seqs) before 429"),
    _F("--scheduling-policy", "scheduler", default="fcfs", choices=tuple(SCHEDULING_POLICIES),
       field="scheduler.scheduling_policy", llm="scheduling_policy", help=(
           "admission order: first come first served, or by the request's `priority` (lower first, then "
           "arrival); under memory pressure the worst priority is preempted")),
    _F("--priority-aging-s", "scheduler", type=float, field="scheduler.priority_aging_s", llm="priority_aging_s",
       help=("priority policy: every this many seconds of waiting lower a request's effective priority by 1, so "
             "low priorities are not starved (default: no aging)")),
    _F("--tensor-parallel-size", "parallel", type=int, default=1, field="parallel.tensor_parallel_size",
       llm="tensor_parallel_size", help="devices per replica (Megatron TP)"),
    _F("--data-parallel-size", "parallel", type=int, default=1, field="parallel.data_parallel_size",
       llm="data_parallel_size", help="replicas, each with its own KV pool"),
    _F("--enable-expert-parallel", "parallel", action="store_true", default=False,
       field="parallel.enable_expert_parallel", llm="enable_expert_parallel", help=(
           "mixture-of-experts models: split the experts over the replica's devices (an expert mesh axis) instead "
           "of splitting every expert's width; attention stays tensor-parallel over all of them")),
    _F("--expert-parallel-size", "parallel", type=int, field="parallel.expert_parallel_size",
       llm="expert_parallel_size", help=(
           "with --enable-expert-parallel: devices the experts are split over, dividing --tensor-parallel-size; "
           "each expert's width is split over the rest (default: all of them)")),
    _F("--coordinator-address", "parallel", field="parallel.coordinator_address",
       help="HOST:PORT of process 0 (multi-host; default: single process or from the environment)"),
    _F("--num-processes", "parallel", type=int, field="parallel.num_processes",
       help="processes in a multi-host run (default: from the environment)"),
    _F("--process-id", "parallel", type=int, field="parallel.process_id",
       help="this process's rank, 0 serves HTTP (default: from the environment)"),
    _F("--host", "server", default="127.0.0.1", help="address to listen on"),
    _F("--port", "server", type=int, default=8000, help="TCP port"),
    _F("--api-key", "server",
       help="require `Authorization: Bearer <key>` on /v1 (default: none, no authentication)"),
    _F("--max-queue-wait", "server", type=float, default=30.0, help=(
        "bound in seconds on a request's estimated wait for a sequence slot: past it, 429 at once with "
        "Retry-After = the estimate; a request queued beyond the free slots still waiting after twice "
        "this gets 429 queue_wait_expired")),
    _F("--request-timeout", "server", type=float, help="per-request deadline in seconds (default: none)"),
    _F("--truncate-prompt", "server", default="none", choices=("none", "left"),
       help="over-long prompts: 400, or keep the last tokens"),
    _F("--shutdown-timeout", "server", type=float, default=30.0, help="SIGTERM grace period (s)"),
    _F("--timeout-keep-alive", "server", type=float, default=75.0, help=(
        "seconds an idle keep-alive connection stays open; keep it above the idle timeout of a load balancer that "
        "reuses connections to the server (nginx: 60 s)")),
    _F("--max-request-bytes", "server", type=parse_bytes, default=16 << 20,
       help="larger request bodies get 413 before parsing (default: 16MiB)"),
    _F("--parse-special-tokens-in-messages", "server", action="store_true", default=False, help=(
        "special-token strings typed in chat messages become control tokens (default: plain text, so a message "
        "cannot forge a turn)")),
    _F("--instance-id", "server", help=(
        "value of the x-jaxinfer-instance header on every response, which shows behind a load balancer where a "
        "request went (default: hostname:port)")),
    _F("--responses-store-max-entries", "server", type=int, default=10_000, help=(
        "most /v1/responses objects kept in memory for previous_response_id and GET /v1/responses/{id}, least "
        "recently used evicted first (0: store nothing); none survives a restart")),
    _F("--responses-store-max-bytes", "server", type=parse_bytes, default=256 << 20,
       help="memory budget of the responses store (their JSON; default: 256MiB)"),
    _F("--responses-store-max-age", "server", type=float, default=86_400.0,
       help="seconds a stored response is kept after it was created (default: 86400)"),
    _F("--disable-log-requests", "server", action="store_true", default=False,
       help="no log line per request received and finished"),
    _F("--log-level", "server", default="info", choices=("debug", "info", "warning", "error"), help="log level"),
    _F("--scheduler", "advanced", default="continuous", choices=("continuous", "static"),
       field="scheduler.scheduler", llm="scheduler", help="continuous batching, or the static-batching baseline"),
    _F("--batch-timeout", "advanced", type=float, default=0.1, field="scheduler.batch_timeout_s",
       help="static scheduler: seconds the oldest request waits for a full batch"),
    _F("--load-format", "advanced", default="auto", choices=("auto", "dummy"), llm="load_format",
       help="dummy: random weights of the model's shapes"),
    _F("--warmup", "advanced", default=True, action="bool", field="warmup", llm="warmup",
       help="compile every bucket before serving"),
)
_BY_DEST = {f.dest: f for f in FLAGS}


def flag(dest: str) -> Flag:
    """The `Flag` whose argparse ``dest`` is ``dest`` (``"max_num_seqs"``). Raises: KeyError: no such flag."""
    return _BY_DEST[dest]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every flag's default once: appended as ``(default: X)`` unless the help text
    already says ``default:`` itself (for defaults that depend on something else)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def add_engine_args(parser: argparse.ArgumentParser, groups: Iterable[str] = tuple(GROUPS), *,
                    only: Iterable[str] | None = None, titled: bool = True,
                    overrides: dict[str, dict] | None = None) -> None:
    """Add the table's flags of ``groups`` (keys of `GROUPS`) to ``parser``, in table order.

    Args:
      only: the ``dest`` names to add (None: every flag of those groups).
      titled: put each group's flags under its ``--help`` section title (`GROUPS`).
      overrides: ``{dest: add_argument keywords}`` for a tool whose flag differs (the
        planner's ``--dtype`` has no ``auto``).
    """
    only = None if only is None else set(only)
    overrides = overrides or {}
    for key in groups:
        flags = [f for f in FLAGS if f.group == key and (only is None or f.dest in only)]
        target = parser.add_argument_group(GROUPS[key]) if titled and flags else parser
        for f in flags:
            f.add_to(target, **overrides.get(f.dest, {}))


def llm_defaults() -> dict[str, Any]:
    """``{LLM keyword: default}`` of the flags `jaxinfer.entrypoints.llm.LLM` takes (`Flag.llm`)."""
    return {f.llm: f.default for f in FLAGS if f.llm is not None}


def llm_namespace(values: dict[str, Any]) -> argparse.Namespace:
    """``{LLM keyword: value}`` -> the flags' ``dest`` attributes, for `engine_config`.

    Raises:
      KeyError: a keyword that is no flag's `Flag.llm`.
    """
    dest = {f.llm: f.dest for f in FLAGS if f.llm is not None}
    return argparse.Namespace(**{dest[k]: v for k, v in values.items()})


def _value(args, f: Flag):
    value = getattr(args, f.dest, f.default)
    return value[0] if isinstance(value, list) else value  # a repeatable flag: the first model's


def _fields(args, section: str) -> dict[str, Any]:
    """``{field: value}`` of the flags that set ``section``'s fields ("" for `EngineConfig`'s own)."""
    return {f.field.rpartition(".")[2]: _value(args, f) for f in FLAGS
            if f.field is not None and f.field.rpartition(".")[0] == section}


def parallel_config(args) -> ParallelConfig:
    """The `ParallelConfig` of the flags (missing ones: their defaults).

    Raises:
      ValueError: a value `ParallelConfig` refuses.
    """
    return ParallelConfig(**_fields(args, "parallel"))


def engine_config(args, model_config: ModelConfig, **extra) -> EngineConfig:
    """The `EngineConfig` of parsed flags (or any object with their ``dest`` attributes;
    missing ones take the table's defaults). ``--max-model-len`` defaults to
    min(4096, ``model_config.max_position_embeddings``); a repeated ``--model`` /
    ``--chat-template`` gives the first; ``extra``: other `EngineConfig` fields.

    Raises:
      ValueError: a value the configuration refuses (from `EngineConfig` and its parts).
    """
    from jaxinfer.spec_decode import SpeculativeConfig

    scheduler = _fields(args, "scheduler")
    if scheduler["max_model_len"] is None:
        scheduler["max_model_len"] = min(4096, model_config.max_position_embeddings)
    own = _fields(args, "")
    pooler = pooler_config(_value(args, flag("pooler_config")))
    if pooler is not None:
        own["pooling_type"] = pooler
    return EngineConfig(
        model_path=_value(args, flag("model")) or DEFAULT_MODEL, cache=CacheConfig(**_fields(args, "cache")),
        scheduler=SchedulerConfig(**scheduler), parallel=parallel_config(args),
        speculative=SpeculativeConfig.from_value(_value(args, flag("speculative_config"))), **own, **extra)


def pooler_config(value) -> str | None:
    """The pooling type of a ``--pooler-config`` value (vLLM's JSON, ``{"pooling_type": "MEAN"}``;
    a dict is taken as is), or None when not given.

    Raises:
      ValueError: not a JSON object, a key other than ``pooling_type``, an unknown type.
    """
    import json

    if value is None:
        return None
    try:
        d = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError as exc:
        raise ValueError(f"--pooler-config is not JSON: {exc}") from None
    if not isinstance(d, dict) or set(d) - {"pooling_type"}:
        raise ValueError(f"--pooler-config takes a JSON object with pooling_type only, got {value!r}")
    if "pooling_type" not in d:
        return None
    try:
        return parse_pooling_type(d["pooling_type"])
    except ValueError as exc:
        raise ValueError(f"--pooler-config: {exc}") from None
