"""Shared test helpers: tiny random Llama configs mirrored into transformers."""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from jaxinfer.config import ModelConfig


def assert_imports_no_jax(code: str, cwd=None) -> None:
    """Run ``code`` in a fresh interpreter and assert it left JAX unimported (host-side
    modules, and the load generator that runs beside the server it measures)."""
    import subprocess
    import sys

    check = "\nimport sys; assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))"
    subprocess.run([sys.executable, "-c", code + check], check=True, cwd=cwd)


def run_until_idle(engine) -> dict:
    """Step ``engine`` until nothing is left; the final `RequestOutput` of each request id."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return done


def run_requests(engine, prompts, params) -> list:
    """Add ``prompts`` (ids ``"0"``, ``"1"``...; ``params`` one for all or one each), step
    ``engine`` until idle, assert nothing leaked; each request's first `CompletionOutput`."""
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, params[i] if isinstance(params, list) else params)
    done = run_until_idle(engine)
    assert engine.num_free_blocks == engine.num_total_blocks and not engine.requests  # nothing leaked
    return [done[str(i)].outputs[0] for i in range(len(prompts))]


def tiny_config(vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, inter=128, tied=False, max_pos=512):
    return ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=max_pos,
                       tie_word_embeddings=tied, bos_token_id=1, eos_token_ids=(2,))


def tiny_hf_config(**overrides) -> dict:
    """A tiny model's HF ``config.json`` dict (2 layers, 6 q / 2 KV heads of 16), for scripts that
    read a config file."""
    d = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "rope_theta": 10000.0,
         "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "tie_word_embeddings": False,
         "bos_token_id": 1, "eos_token_id": 2}
    return {**d, **overrides}


def to_hf_state_dict(cfg: ModelConfig, params) -> dict[str, np.ndarray]:
    """Our params tree -> HF LlamaForCausalLM state dict (numpy), the inverse of convert."""
    L, D = cfg.num_hidden_layers, cfg.hidden_size
    lay = params["layers"]
    sd = {"model.embed_tokens.weight": params["embed"]["embedding"], "model.norm.weight": params["final_norm"]["scale"]}
    for i in range(L):
        p = f"model.layers.{i}."
        a, m = lay["attn"], lay["mlp"]
        sd[p + "self_attn.q_proj.weight"] = a["q_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.k_proj.weight"] = a["k_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.v_proj.weight"] = a["v_proj"]["kernel"][i].reshape(D, -1).T
        sd[p + "self_attn.o_proj.weight"] = a["o_proj"]["kernel"][i].reshape(-1, D).T
        sd[p + "mlp.gate_proj.weight"] = m["gate_proj"]["kernel"][i].T
        sd[p + "mlp.up_proj.weight"] = m["up_proj"]["kernel"][i].T
        sd[p + "mlp.down_proj.weight"] = m["down_proj"]["kernel"][i].T
        sd[p + "input_layernorm.weight"] = lay["input_norm"]["scale"][i]
        sd[p + "post_attention_layernorm.weight"] = lay["post_attention_norm"]["scale"][i]
    if not cfg.tie_word_embeddings:
        sd["lm_head.weight"] = params["lm_head"]["kernel"].T
    return {k: np.ascontiguousarray(v) for k, v in sd.items()}


def hf_model(cfg: ModelConfig, params):
    """A float32 transformers LlamaForCausalLM holding our weights."""
    import torch
    import transformers

    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k not in ("architectures",)})
    model = transformers.LlamaForCausalLM(hf_cfg).eval().to(torch.float32)
    sd = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in to_hf_state_dict(cfg, params).items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    allowed = ("rotary", "lm_head") if cfg.tie_word_embeddings else ("rotary",)
    assert not unexpected and all(any(a in m for a in allowed) for m in missing), (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


def hf_logits(model, token_ids) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0].numpy()


@contextlib.contextmanager
def borrowed_runner(engine, num_blocks: int | None = None, **cache_overrides):
    """A second engine over ``engine``'s compiled runner (and so its KV memory).

    The borrower writes the shared KV memory, so the owner's prefix cache is reset after.
    """
    from jaxinfer.engine.llm_engine import LLMEngine

    cache = dataclasses.replace(engine.config.cache, **cache_overrides)
    other = LLMEngine(dataclasses.replace(engine.config, cache=cache), engine.model_config, engine.runner,
                      num_blocks or engine.block_manager.num_blocks, engine.tokenizer)
    try:
        yield other
    finally:
        assert engine.reset_prefix_cache(), "owner engine must be idle while its runner is borrowed"


def http_healthy(url: str) -> bool:
    """``GET url/health`` answered 200 (False on any HTTP or connection error)."""
    import httpx

    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def post_completions_at_once(url: str, clients: int, max_tokens: int, join_s: float) -> tuple[dict, list]:
    """``clients`` threads each POST one ``/v1/completions`` (prompt ``[1000 + i]``, odd ones
    streamed); returns ({i: response or the exception raised}, the threads, joined for up
    to ``join_s`` seconds each)."""
    import threading

    import httpx

    results: dict = {}

    def call(i: int) -> None:
        body = {"prompt": [1000 + i], "max_tokens": max_tokens, "ignore_eos": True, "stream": i % 2 == 1}
        try:
            with httpx.Client(timeout=30) as c:
                results[i] = c.post(url + "/v1/completions", json=body)
        except BaseException as exc:  # noqa: BLE001 - the caller asserts on it
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_s)
    return results, threads


def resolved_plan(cfg, dtype: str, plan=None, **changes):
    """``plan`` (a function of the resolved `jaxinfer.platform.execution_plan.ExecutionPlan`, or None) applied
    to the plan the engine would resolve for ``cfg`` and ``dtype`` on one device, then
    ``dataclasses.replace``'d with ``changes``: how a test picks a path."""
    from jaxinfer.config import BLOCK_SIZE
    from jaxinfer.platform.execution_plan import resolve_plan

    resolved = resolve_plan(cfg, dtype, "xla", block_size=BLOCK_SIZE)
    return dataclasses.replace(plan(resolved) if plan else resolved, **changes)


def unpacked(plan):
    """``plan`` without its packed linear method: the method it falls back to runs everything
    (as on a CPU without AMX, AVX-512 BF16 or VNNI)."""
    return dataclasses.replace(plan, linear=plan.linear_fallback or plan.linear, linear_fallback=None,
                               instruction_set=None)


def tiny_bf16_llm(hidden_act: str = "silu", plan=None, **changes):
    """A tiny random bfloat16 model (tied head, dims multiples of 32, MLP gate ``hidden_act``) that
    returns each step's logits: for tests that compare a C++ product path against XLA's (``plan``
    and ``changes`` pick the path, `resolved_plan`)."""
    from jaxinfer import LLM
    from jaxinfer.models.params import init_params

    cfg = dataclasses.replace(tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=True), hidden_act=hidden_act)
    return LLM("tiny", dtype="bfloat16", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32,
               num_blocks=64, model_config=cfg, params=init_params(cfg, "bfloat16", seed=1), tokenizer=None,
               warmup=False, enable_prefix_caching=False, return_logits=True,
               plan=resolved_plan(cfg, "bfloat16", plan, **changes))


def register_source_variant(source, first_lines: str, name: str, env_switch: str, targets: dict[str, str]):
    """A native kernel's ``source`` (a Path in jaxinfer/kernels/cpu/csrc/) with ``first_lines`` put before it
    (e.g. ``#define JAXINFER_NO_AMX 1``), built and registered under ``targets`` (test target ->
    exported symbol); None, or why not. The copy sits beside the headers it includes and is
    removed after the build."""
    import logging
    import os

    from jaxinfer.kernels.cpu import build as native_build

    copy = source.with_name(f"_test_{name}_{os.getpid()}.cc")
    copy.write_text(first_lines + source.read_text())
    try:
        return native_build.register(copy, f"{source.stem} ({name}, test)", env_switch, targets,
                                     logging.getLogger(__name__))
    finally:
        copy.unlink()
