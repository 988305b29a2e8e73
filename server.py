"""Serve a model over an OpenAI-compatible HTTP API: ``python server.py [flags]``.

HTTP listens at once (``GET /live`` is 200); the model loads and every bucket compiles in
the engine thread meanwhile, and ``/health`` and every POST answer 503 + Retry-After until
that is done. SIGTERM drains: new requests get 503 + Retry-After (the listener stays open
until the drain ends), in-flight ones get ``--shutdown-timeout`` seconds to finish, then the
process exits (status 0); the log says how many were in flight and how the drain ended. An
engine step that raises fails every request in flight and ends the process with status 1
within 5 s (`jaxinfer.entrypoints.openai.engine_death`; docs/api.md's fault policy). Start-up logs one line of
effective settings and the warm-up's progress.
Flags map one-to-one onto `EngineConfig` / `CacheConfig` / `SchedulerConfig` / `ServerConfig`;
the engine's are declared once, in `jaxinfer.config.args` (shared with `LLM` and the planner).
Binds 127.0.0.1 unless ``--host`` says otherwise. ``--model`` may be repeated: one engine
(one KV pool) per model, with the KV budget split between them (`jaxinfer.entrypoints.served_models`);
``--fallback-model`` and ``--degrade-ttft-slo`` turn on graceful degradation
(`jaxinfer.entrypoints.openai.degrade`).
"""
from __future__ import annotations

import argparse
import logging
import socket
import threading
import types

from jaxinfer.entrypoints.openai.lifecycle import listen_socket, serve, uvicorn_config  # noqa: F401 - part of this script's API
from jaxinfer.config.args import DEFAULT_MODEL, HelpFormatter, add_engine_args, engine_config, parallel_config
from jaxinfer.config.args import parse_bytes  # noqa: F401 - part of this script's API

logger = logging.getLogger("jaxinfer.server")

# Engines are built one at a time: several models' engine threads would otherwise import
# transformers (not thread-safe on first import), read checkpoints and compile all at once.
_BUILD_LOCK = threading.Lock()


def build_parser() -> argparse.ArgumentParser:
    """``server.py``'s parser: every flag of `jaxinfer.config.args.FLAGS`, in its groups."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=HelpFormatter)
    add_engine_args(p)
    return p


def served_specs(args):
    """The `jaxinfer.entrypoints.served_models.ModelSpec` of each model the flags name, before the KV split.

    Raises:
      ValueError: more names than models, duplicate served names, or degradation flags
        given without each other.
    """
    from jaxinfer.entrypoints.served_models import model_specs

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
    from jaxinfer.entrypoints.openai.config import ServerConfig

    name = served_specs(args)[0].name
    instance_id = f"{socket.gethostname()}:{args.port}" if args.instance_id is None else args.instance_id
    return ServerConfig(host=args.host, port=args.port, served_model_name=name,
                        api_key=args.api_key, max_queue_wait=args.max_queue_wait,
                        request_timeout=args.request_timeout, truncate_prompt=args.truncate_prompt,
                        shutdown_timeout=args.shutdown_timeout, timeout_keep_alive=args.timeout_keep_alive,
                        max_request_bytes=args.max_request_bytes,
                        parse_special_tokens_in_messages=args.parse_special_tokens_in_messages,
                        instance_id=instance_id, responses_store_max_entries=args.responses_store_max_entries,
                        responses_store_max_bytes=args.responses_store_max_bytes,
                        responses_store_max_age=args.responses_store_max_age)


def engine_builder(args):
    """A zero-argument callable that loads, builds and warms up the engine (run in the engine
    thread). ``--dtype auto`` is resolved there, once JAX knows its devices. With several
    models, one engine is built at a time (`_BUILD_LOCK`); the others wait their turn."""

    def build():
        with _BUILD_LOCK:
            return _build()

    def _build():
        from jaxinfer.engine.builder import build_engine, load_model, resolve_dtype
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
            from jaxinfer.tokenizer.templates import load_chat_template

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
    from jaxinfer.weights.catalog import model_kind

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
    from jaxinfer.engine.builder import cpu_default_kv_bytes
    from jaxinfer.config import DEFAULT_GPU_MEMORY_UTILIZATION
    from jaxinfer.entrypoints.served_models import describe_split, split_kv_budget

    specs = served_specs(args)
    # on a CPU the default budget is shared by the engine's CPU devices (jaxinfer.engine.builder.kv_pool_budget)
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
    from jaxinfer.entrypoints.openai.app import create_app
    from jaxinfer.entrypoints.openai.model_registry import ModelRegistry, ServedModel
    from jaxinfer.engine.async_engine import AsyncEngine

    from jaxinfer.distributed import multihost as distributed

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
        from jaxinfer.distributed import peer_failure

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
    steps until it stops. A failure here ends every process (`jaxinfer.distributed.peer_failure`)."""
    import jax

    from jaxinfer.distributed import multihost as distributed

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
