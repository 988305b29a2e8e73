"""Serve a model over an OpenAI-compatible HTTP API: ``python server.py [flags]``.

HTTP listens at once (``GET /live`` is 200); the model loads and every bucket compiles in
the engine thread meanwhile, and ``/health`` and every POST answer 503 + Retry-After until
that is done. SIGTERM drains: new requests get 503 + Retry-After (the listener stays open
until the drain ends), in-flight ones get ``--shutdown-timeout`` seconds to finish, then the
process exits (status 0); the log says how many were in flight and how the drain ended. An
engine step that raises fails every request in flight and ends the process with status 1
within 5 s (`jaxinfer.api.engine_death`; docs/api.md's fault policy). Start-up logs one line of
effective settings and the warm-up's progress.
Flags map one-to-one onto `EngineConfig` / `CacheConfig` / `SchedulerConfig` / `ServerConfig`.
Binds 127.0.0.1 unless ``--host`` says otherwise. ``--model`` may be repeated: one engine
(one KV pool) per model, with the KV budget split between them (`jaxinfer.served_models`);
``--fallback-model`` and ``--degrade-ttft-slo`` turn on graceful degradation
(`jaxinfer.api.degrade`).
"""
from __future__ import annotations

import argparse
import logging
import socket
import threading
import types

from jaxinfer.api.lifecycle import listen_socket, serve, uvicorn_config  # noqa: F401 - part of this script's API
from jaxinfer.engine_args import parse_bytes  # noqa: F401 - part of this script's API

logger = logging.getLogger("jaxinfer.server")

DEFAULT_MODEL = "smollm2-135m-instruct"
# Engines are built one at a time: several models' engine threads would otherwise import
# transformers (not thread-safe on first import), read checkpoints and compile all at once.
_BUILD_LOCK = threading.Lock()
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every flag's default once: appended as ``(default: X)`` unless the help text
    already says ``default:`` itself (for defaults that depend on something else)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default:" in text or action.default is argparse.SUPPRESS:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from jaxinfer.config import BLOCK_SIZE, BLOCK_SIZES, DEFAULT_GPU_MEMORY_UTILIZATION, DTYPES

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    model = p.add_argument_group("model")
    model.add_argument("--model", action="append", default=None,
                       help="name under weights/, a converted folder, a HF checkpoint folder or a .gguf file; repeat "
                       f"it to serve several models, each with its own engine and KV pool (default: {DEFAULT_MODEL})")
    model.add_argument("--served-model-name", action="append", default=None,
                       help="name clients send as `model`; repeat it to name each --model in order "
                       "(default: the --model value)")
    model.add_argument("--fallback-model", default=None,
                       help="model that takes requests whose estimated time to first token exceeds "
                       "--degrade-ttft-slo: a served name, or another model to load and serve under this name "
                       "(default: none, no degradation)")
    model.add_argument("--degrade-ttft-slo", type=float, default=None,
                       help="time-to-first-token target in seconds for --fallback-model (default: none)")
    model.add_argument("--tokenizer", default=None, help="folder (or name under weights/) to load the tokenizer and "
                       "chat template from (default: the model's folder)")
    model.add_argument("--chat-template", action="append", default=None, metavar="FILE",
                       help="chat template for /v1/chat/completions, replacing the tokenizer's: a Jinja file, a "
                       "bundled name (gemma3) or the template text; models without one (pretrained base models "
                       "such as gemma3-270m) answer chat requests with 400 (default: the tokenizer's); repeatable, paired with --model "
                       "by position")
    model.add_argument("--dtype", default="auto", choices=DTYPES,
                       help="weights, activations and KV cache; auto: bfloat16 on GPU/TPU and on CPUs with AVX-512 BF16 or AMX, else float32")
    model.add_argument("--quantization", default=None, choices=["int8"],
                       help="int8: weights quantized to int8 with group scales (one per 64 inputs) as they load "
                       "(docs/quantization.md; default: none)")
    model.add_argument("--attention-backend", default=None, choices=["xla", "pallas"],
                       help="default: pallas on GPU, xla elsewhere")
    model.add_argument("--seed", type=int, default=0, help="seed of requests that give none")
    model.add_argument("--max-logprobs", type=int, default=20, help="largest top logprobs a request may ask for")
    cache = p.add_argument_group("KV cache")
    cache.add_argument("--gpu-memory-utilization", type=float, default=None,
                       help="fraction of device memory for weights, activations and KV cache together; does not "
                       f"apply on CPU (default: {DEFAULT_GPU_MEMORY_UTILIZATION}; on CPU the KV budget is 4 GiB, at most a quarter of RAM)")
    cache.add_argument("--kv-cache-memory", type=parse_bytes, default=None,
                       help="KV budget per device, e.g. 2GiB (default: from --gpu-memory-utilization)")
    cache.add_argument("--num-blocks", type=int, default=None,
                       help="explicit KV pool size, overrides the budgets (default: from the budget)")
    cache.add_argument("--block-size", type=int, default=BLOCK_SIZE, choices=BLOCK_SIZES, help="tokens per KV block")
    cache.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8", "fp8"],
                       help="auto: the model dtype; int8 / fp8 (e4m3): 8-bit K/V with a scale per token and KV head, "
                       "about twice the blocks of bfloat16 in the same budget (docs/quantization.md)")
    cache.add_argument("--watermark", type=float, default=0.15, help="fraction of blocks kept free at admission")
    cache.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                       help="reuse KV blocks of shared prompt prefixes (--no-prefix-caching turns it off)")
    sched = p.add_argument_group("scheduler")
    sched.add_argument("--max-model-len", type=int, default=None,
                       help="prompt + output tokens (default: min(4096, model context))")
    sched.add_argument("--max-num-seqs", type=int, default=32, help="sequences running at once")
    sched.add_argument("--max-num-batched-tokens", type=int, default=512, help="tokens per step (prefill + decode)")
    sched.add_argument("--prefill-budget-while-decoding", type=int, default=None,
                       help="cap on prompt tokens in a step that also decodes, so running streams keep their "
                            "inter-token latency (default: none, only --max-num-batched-tokens; 96 kept ITL p99 "
                            "within 2x a decode step on a 2-core CPU at 32 streams, for a later first token)")
    sched.add_argument("--speculative-config", default=None, metavar="JSON",
                       help="speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                            "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' (docs/speculative_decoding.md; "
                            "default: off)")
    sched.add_argument("--max-queue-len", type=int, default=256, help="requests waiting beyond the free sequence slots (--max-num-seqs) before 429")
    sched.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                       help="admission order: first come first served, or by the request's `priority` (lower "
                            "first, then arrival); under memory pressure the worst priority is preempted")
    sched.add_argument("--priority-aging-s", type=float, default=None,
                       help="priority policy: every this many seconds of waiting lower a request's effective "
                            "priority by 1, so low priorities are not starved (default: no aging)")
    par = p.add_argument_group("parallelism (docs/distributed.md)")
    par.add_argument("--tensor-parallel-size", type=int, default=1, help="devices per replica (Megatron TP)")
    par.add_argument("--data-parallel-size", type=int, default=1, help="replicas, each with its own KV pool")
    par.add_argument("--coordinator-address", default=None,
                     help="HOST:PORT of process 0 (multi-host; default: single process or from the environment)")
    par.add_argument("--num-processes", type=int, default=None,
                     help="processes in a multi-host run (default: from the environment)")
    par.add_argument("--process-id", type=int, default=None,
                     help="this process's rank, 0 serves HTTP (default: from the environment)")
    server = p.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on")
    server.add_argument("--port", type=int, default=8000, help="TCP port")
    server.add_argument("--api-key", default=None,
                        help="require `Authorization: Bearer <key>` on /v1 (default: none, no authentication)")
    server.add_argument("--max-queue-wait", type=float, default=30.0, help="seconds unadmitted before 429")
    server.add_argument("--request-timeout", type=float, default=None,
                        help="per-request deadline in seconds (default: none)")
    server.add_argument("--truncate-prompt", default="none", choices=["none", "left"],
                        help="over-long prompts: 400, or keep the last tokens")
    server.add_argument("--shutdown-timeout", type=float, default=30.0, help="SIGTERM grace period (s)")
    server.add_argument("--timeout-keep-alive", type=float, default=75.0,
                        help="seconds an idle keep-alive connection stays open; keep it above the idle timeout "
                             "of a load balancer that reuses connections to the server (nginx: 60 s)")
    server.add_argument("--max-request-bytes", type=parse_bytes, default=16 << 20,
                        help="larger request bodies get 413 before parsing (default: 16MiB)")
    server.add_argument("--parse-special-tokens-in-messages", action="store_true",
                        help="special-token strings typed in chat messages become control tokens "
                             "(default: plain text, so a message cannot forge a turn)")
    server.add_argument("--instance-id", default=None,
                        help="value of the x-jaxinfer-instance header on every response, which shows behind a load "
                             "balancer where a request went (default: hostname:port)")
    server.add_argument("--disable-log-requests", action="store_true",
                        help="no log line per request received and finished")
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                        help="log level")
    adv = p.add_argument_group("advanced (benchmarks and debugging)")
    adv.add_argument("--scheduler", default="continuous", choices=["continuous", "static"],
                     help="continuous batching, or the static-batching baseline")
    adv.add_argument("--batch-timeout", type=float, default=0.1,
                     help="static scheduler: seconds the oldest request waits for a full batch")
    adv.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                     help="dummy: random weights of the model's shapes")
    adv.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                     help="compile every bucket before serving")
    return p


def served_specs(args):
    """The `jaxinfer.served_models.ModelSpec` of each model the flags name, before the KV split.

    Raises:
      ValueError: more names than models, duplicate served names, or degradation flags
        given without each other.
    """
    from jaxinfer.served_models import model_specs

    if (args.fallback_model is None) != (args.degrade_ttft_slo is None):
        raise ValueError("--fallback-model and --degrade-ttft-slo go together (give both or neither)")
    if args.degrade_ttft_slo is not None and not args.degrade_ttft_slo > 0:
        raise ValueError(f"--degrade-ttft-slo must be > 0 seconds, got {args.degrade_ttft_slo}")
    return model_specs(args.model or [DEFAULT_MODEL], args.served_model_name, args.fallback_model,
                       args.chat_template)


def model_args(args, spec) -> argparse.Namespace:
    """The flags of one model: ``args`` with that model's path and KV share."""
    return argparse.Namespace(**{**vars(args), "model": spec.path, "kv_cache_memory": spec.kv_cache_memory,
                                 "gpu_memory_utilization": spec.gpu_memory_utilization,
                                 "chat_template": spec.chat_template})


def server_config(args):
    from jaxinfer.api.config import ServerConfig

    name = served_specs(args)[0].name
    instance_id = f"{socket.gethostname()}:{args.port}" if args.instance_id is None else args.instance_id
    return ServerConfig(host=args.host, port=args.port, served_model_name=name,
                        api_key=args.api_key, max_queue_wait=args.max_queue_wait,
                        request_timeout=args.request_timeout, truncate_prompt=args.truncate_prompt,
                        shutdown_timeout=args.shutdown_timeout, timeout_keep_alive=args.timeout_keep_alive,
                        max_request_bytes=args.max_request_bytes,
                        parse_special_tokens_in_messages=args.parse_special_tokens_in_messages,
                        instance_id=instance_id)


def engine_config(args, model_config):
    """The `EngineConfig` of the flags; ``--max-model-len`` defaults to min(4096, the model's context)."""
    from jaxinfer.config import CacheConfig, EngineConfig, SchedulerConfig
    from jaxinfer.spec_decode import SpeculativeConfig

    max_model_len = args.max_model_len
    if max_model_len is None:
        max_model_len = min(4096, model_config.max_position_embeddings)
    model_path = args.model[0] if isinstance(args.model, list) else (args.model or DEFAULT_MODEL)
    chat_template = args.chat_template[0] if isinstance(args.chat_template, list) else args.chat_template
    return EngineConfig(
        model_path=model_path, dtype=args.dtype, tokenizer=args.tokenizer, chat_template=chat_template,
        cache=CacheConfig(num_blocks=args.num_blocks, kv_cache_memory=args.kv_cache_memory, watermark=args.watermark,
                          enable_prefix_caching=args.prefix_caching, block_size=args.block_size,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          kv_cache_dtype=getattr(args, "kv_cache_dtype", "auto")),
        quantization=getattr(args, "quantization", None),
        scheduler=SchedulerConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_model_len=max_model_len, max_queue_len=args.max_queue_len,
                                  scheduler=args.scheduler, batch_timeout_s=args.batch_timeout,
                                  prefill_budget_while_decoding=args.prefill_budget_while_decoding,
                                  scheduling_policy=args.scheduling_policy, priority_aging_s=args.priority_aging_s),
        attention_backend=args.attention_backend, max_logprobs=args.max_logprobs, seed=args.seed, warmup=args.warmup,
        parallel=parallel_config(args), speculative=SpeculativeConfig.from_value(args.speculative_config))


def parallel_config(args):
    from jaxinfer.config import ParallelConfig

    return ParallelConfig(tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
                          coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                          process_id=args.process_id)


def engine_builder(args):
    """A zero-argument callable that loads, builds and warms up the engine (run in the engine
    thread). ``--dtype auto`` is resolved there, once JAX knows its devices. With several
    models, one engine is built at a time (`_BUILD_LOCK`); the others wait their turn."""

    def build():
        with _BUILD_LOCK:
            return _build()

    def _build():
        from jaxinfer.builder import build_engine, load_model, resolve_dtype
        from jaxinfer.config import EngineConfig

        resolved = argparse.Namespace(**{**vars(args), "dtype": resolve_dtype(args.dtype)})
        probe = EngineConfig(model_path=args.model, dtype=resolved.dtype, parallel=parallel_config(args),
                             tokenizer=args.tokenizer)
        model_config, params, tokenizer, _ = load_model(probe, args.load_format)
        return build_engine(engine_config(resolved, model_config), load_format=args.load_format,
                            model_config=model_config, params=params, tokenizer=tokenizer)

    return build


def check_flags(parser: argparse.ArgumentParser, args) -> None:
    """Refuse flag values the configuration rejects (exit 2 with the reason) before anything loads."""
    probe = types.SimpleNamespace(max_position_embeddings=4096)  # the real model is not loaded yet
    try:
        server_config(args)
        engine_config(args, probe)
        specs = served_specs(args)
        for template in args.chat_template or []:
            from jaxinfer.templates import load_chat_template

            load_chat_template(template)
    except ValueError as e:
        parser.error(str(e))
    multi_host = (args.num_processes or 1) > 1 or args.coordinator_address is not None
    if len(specs) > 1 and multi_host:
        parser.error("several models (--model repeated, or --fallback-model) need a single-process server")


def check_models(parser: argparse.ArgumentParser, args) -> None:
    """Refuse an unknown ``--model`` / ``--fallback-model`` (exit 2, one line) before anything
    loads: a misspelt name must not look like an engine crash."""
    if args.load_format == "dummy":
        return
    from jaxinfer.weights import model_kind

    try:
        for spec in served_specs(args):
            model_kind(spec.path)
    except ValueError as e:
        fail(parser, str(e))


NOISY_LOGGERS = ("absl", "jax._src.xla_bridge")  # orbax's checkpoint chatter, JAX's "no TPU here"


def quiet_libraries(log_level: str) -> None:
    """At ``--log-level info``, the libraries' own INFO lines (a dozen per checkpoint load,
    one per platform JAX did not find) are hidden, so the log says what the server does;
    ``--log-level debug`` shows them."""
    if log_level != "debug":
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(log_level.upper())))


def fail(parser: argparse.ArgumentParser, message: str) -> None:
    """Exit with status 2 and ``server.py: error: message``: argparse's error without the usage
    text, for a reason that is not a flag's spelling (an unknown model, a busy port)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def kv_split(args):
    """Each model's `ModelSpec` with its share of the KV budget (logged when there are several)."""
    from jaxinfer.builder import cpu_default_kv_bytes
    from jaxinfer.config import DEFAULT_GPU_MEMORY_UTILIZATION
    from jaxinfer.served_models import describe_split, split_kv_budget

    specs = served_specs(args)
    # on a CPU the default budget is shared by the engine's CPU devices (jaxinfer.builder.kv_pool_budget)
    cpu_default = cpu_default_kv_bytes() // (args.tensor_parallel_size * args.data_parallel_size)
    specs = split_kv_budget(specs, args.kv_cache_memory, args.gpu_memory_utilization,
                            DEFAULT_GPU_MEMORY_UTILIZATION, cpu_default if _platform() == "cpu" else None)
    if len(specs) > 1:
        logger.info("%s", f"each model: --num-blocks {args.num_blocks}" if args.num_blocks else describe_split(specs))
    return specs


def _platform() -> str:
    import jax

    return jax.devices()[0].platform


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_flags(parser, args)
    # before anything else that may log: a first log call installs Python's default handler,
    # and basicConfig then does nothing (every INFO line of the server would be lost)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_libraries(args.log_level)
    check_models(parser, args)
    from jaxinfer.api.app import create_app
    from jaxinfer.api.model_registry import ModelRegistry, ServedModel
    from jaxinfer.async_engine import AsyncEngine

    from jaxinfer import distributed

    multi = distributed.initialize(parallel_config(args))  # before any other JAX call; no-op on one process
    if not distributed.is_leader():  # followers run the leader's steps and serve no HTTP
        run_follower(args)
        return
    config = server_config(args)
    try:
        sock = listen_socket(config.host, config.port)
    except OSError as e:
        fail(parser, f"cannot listen on {config.host}:{config.port}: {e}")
    specs = kv_split(args)  # after binding: a busy port fails before JAX starts
    models = ModelRegistry([ServedModel(s.name, AsyncEngine(engine_builder(model_args(args, s)),
                                                            log_requests=not args.disable_log_requests),
                                        kv_cache_memory=s.kv_cache_memory) for s in specs],
                           fallback=args.fallback_model,
                           degrade_ttft_slo=args.degrade_ttft_slo)
    if multi:  # a follower that fails ends the job: fail the requests in flight first (500 / SSE error)
        from jaxinfer import peer_failure

        peer_failure.on_failure(lambda reason: fail_requests(models, reason))
    app = create_app(models, config)
    logger.info("listening on http://%s:%d (model %s loads in the background)", config.host, config.port,
                ", ".join(s.path for s in specs))
    try:
        serve(app, models, config, sock)
    finally:
        if multi:  # stop the followers; if the engine failed, they exit non-zero with us
            engine = models.default.async_engine
            distributed.shutdown(error=None if engine.error is None else f"the leader's engine failed: {engine.error}")


def run_follower(args) -> None:
    """A follower process of a multi-host run: build the same engine, run the leader's
    steps until it stops. A failure here ends every process (`jaxinfer.peer_failure`)."""
    import jax

    from jaxinfer import distributed

    try:
        engine = engine_builder(model_args(args, kv_split(args)[0]))()
    except Exception as e:
        logger.exception("start-up failed")
        distributed.shutdown(error=f"process {jax.process_index()} failed to start: {type(e).__name__}: {e}")
    distributed.serve_follower(engine)
    distributed.shutdown(engine)


def fail_requests(models, reason: str) -> None:
    """Fail every request of every served model now (from any thread; `AsyncEngine.fail`)."""
    for m in models:
        m.async_engine.fail(RuntimeError(reason))


if __name__ == "__main__":
    main()
