"""Start-up says what happens, and the flags vLLM users expect (issue 11): ``dtype="auto"``,
KV sizing from ``gpu_memory_utilization``, other block sizes, ``tokenizer`` from another
folder, the effective-settings line, warm-up progress, prompt-counting progress bars.
Tiny random models (CPU)."""
from __future__ import annotations

import logging
import math
import shutil

import pytest

from api_helpers import fake_engine
from api_helpers import tokenizer as api_tokenizer
from helpers import tiny_config
from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints import llm as llm_mod
from jaxinfer.engine.builder import (cpu_default_kv_bytes, kv_pool_budget, load_model, max_concurrency_at_full_length,
                              resolve_dtype)
from jaxinfer.config import CacheConfig, EngineConfig
from jaxinfer.platform import dtype as platform_dtype
from jaxinfer.platform.dtype import CPU_DTYPE_ENV_VAR, auto_dtype
from jaxinfer.platform.cpu_features import cpu_flags, has_native_bf16
from jaxinfer.models.params import init_params
from jaxinfer.engine.warmup_progress import WarmupProgress

CFG = tiny_config(vocab=256)
PARAMS = init_params(CFG, scale=5.0, seed=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3], list(range(1, 30))]


def tiny(**kw) -> LLM:
    args = dict(max_model_len=128, max_num_seqs=2, max_num_batched_tokens=32, num_blocks=48, model_config=CFG,
                params=PARAMS, tokenizer=None, warmup=False, use_tqdm=False)
    args.update(kw)
    return LLM("tiny", **args)


# ----- dtype auto -------------------------------------------------------------------------
def test_auto_dtype_per_platform(monkeypatch):
    monkeypatch.delenv(CPU_DTYPE_ENV_VAR, raising=False)
    cpu = "bfloat16" if has_native_bf16() else "float32"
    assert [auto_dtype(p) for p in ("cpu", "gpu", "tpu")] == [cpu, "bfloat16", "bfloat16"]
    assert resolve_dtype("bfloat16") == "bfloat16" and resolve_dtype("float32") == "float32"


def test_auto_dtype_on_cpu_follows_the_bf16_dot_instruction(monkeypatch):
    monkeypatch.delenv(CPU_DTYPE_ENV_VAR, raising=False)
    for native, want in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(platform_dtype, "has_native_bf16", lambda native=native: native)
        assert auto_dtype("cpu") == want and auto_dtype("gpu") == "bfloat16"


def test_cpu_dtype_variable_overrides_auto_and_is_checked(monkeypatch):
    monkeypatch.setattr(platform_dtype, "has_native_bf16", lambda: True)
    monkeypatch.setenv(CPU_DTYPE_ENV_VAR, "float32")
    assert auto_dtype("cpu") == "float32" and auto_dtype("gpu") == "bfloat16"
    monkeypatch.setenv(CPU_DTYPE_ENV_VAR, "float16")
    with pytest.raises(ValueError, match="JAXINFER_CPU_DTYPE must be float32 or bfloat16"):
        auto_dtype("cpu")


def test_cpu_flags_from_cpuinfo(tmp_path):
    zen4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
    assert cpu_flags(zen4) >= {"avx512_bf16", "avx2"} and cpu_flags("processor\t: 0\n") == frozenset()
    older = tmp_path / "older"
    older.write_text(zen4.replace(" avx512_bf16", ""))
    newer = tmp_path / "newer"
    newer.write_text(zen4)
    amx = tmp_path / "amx"
    amx.write_text(zen4.replace("avx512_bf16", "amx_bf16 amx_tile"))
    assert [has_native_bf16(str(p)) for p in (older, newer, amx, tmp_path / "missing")] == [False, True, True, False]


def test_llm_dtype_auto_is_resolved_and_logged(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="jaxinfer")
    monkeypatch.setenv(CPU_DTYPE_ENV_VAR, "float32")
    llm = tiny()
    assert llm.engine.config.dtype == "float32" and llm.engine.runner.dtype.name == "float32"
    assert "dtype auto -> float32 (cpu)" in caplog.text
    monkeypatch.setenv(CPU_DTYPE_ENV_VAR, "bfloat16")
    assert tiny().engine.runner.dtype.name == "bfloat16"
    assert "dtype auto -> bfloat16 (cpu)" in caplog.text
    assert tiny(dtype="bfloat16").engine.runner.dtype.name == "bfloat16"  # explicit still honoured
    with pytest.raises(ValueError, match="dtype must be one of"):
        tiny(dtype="float16")


# ----- KV sizing ---------------------------------------------------------------------------
def test_gpu_memory_utilization_sizes_the_pool_from_device_memory():
    gib = 2**30
    budget, why = kv_pool_budget(CacheConfig(gpu_memory_utilization=0.8), 80 * gib, weight_bytes=16 * gib,
                                 reserve_bytes=2 * gib)
    assert budget == 64 * gib - 16 * gib - 2 * gib and "gpu_memory_utilization 0.8" in why
    default, _ = kv_pool_budget(CacheConfig(), 80 * gib, weight_bytes=16 * gib, reserve_bytes=2 * gib)
    assert default == int(80 * gib * 0.9) - 18 * gib  # vLLM's default 0.9
    explicit, why = kv_pool_budget(CacheConfig(kv_cache_memory=3 * gib, gpu_memory_utilization=0.5), 80 * gib,
                                   16 * gib, 2 * gib)
    assert explicit == 3 * gib and why.startswith("--kv-cache-memory")


def test_gpu_memory_utilization_does_not_apply_on_cpu(caplog):
    caplog.set_level(logging.INFO, logger="jaxinfer")
    assert kv_pool_budget(CacheConfig(), None, 10, 10)[0] == cpu_default_kv_bytes()
    assert "does not apply on CPU" not in caplog.text  # not asked for: nothing to say
    assert kv_pool_budget(CacheConfig(gpu_memory_utilization=0.5), None, 10, 10)[0] == cpu_default_kv_bytes()
    assert "--gpu-memory-utilization does not apply on CPU" in caplog.text


def test_cpu_default_budget_is_shared_by_the_engines_cpu_devices():
    """Fake CPU devices all live in the host's RAM: a TP 2 x DP 2 engine gets one default
    budget in all (a newcomer's 4-device example was OOM-killed at 4 x 4 GiB)."""
    one, _ = kv_pool_budget(CacheConfig(), None, 10, 10)
    four, why = kv_pool_budget(CacheConfig(), None, 10, 10, host_devices=4)
    assert four == one // 4 and "shared by 4 CPU devices" in why
    assert one == cpu_default_kv_bytes()


@pytest.mark.parametrize("util", [0.0, -0.1, 1.01])
def test_gpu_memory_utilization_outside_0_1_is_refused(util):
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        CacheConfig(gpu_memory_utilization=util)


def test_max_concurrency_at_full_length_by_hand():
    # 257 blocks: 256 past the null block, watermark ceil(0.15 * 256) = 39 kept free -> 217 usable;
    # a 256-token sequence needs 16 blocks of 16 -> 13 at once
    assert max_concurrency_at_full_length(257, 16, 0.15, 256) == 217 // 16 == 13
    assert max_concurrency_at_full_length(257, 16, 0.0, 256) == 16
    assert max_concurrency_at_full_length(257, 32, 0.0, 250) == 256 // 8 == 32  # ceil(250 / 32) = 8
    assert max_concurrency_at_full_length(10, 16, 0.15, 4096) == 0


def test_settings_line_at_start_up(caplog):
    caplog.set_level(logging.INFO, logger="jaxinfer")
    plan = tiny().engine.runner.plan
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model=")]
    usable = 47 - math.ceil(0.15 * 47)  # watermark of the 47 blocks past the null block
    assert lines == [f"model=tiny dtype=float32 kv_cache_dtype=auto backend=xla max_model_len=128 max_num_seqs=2 "
                     f"max_num_batched_tokens=32 kv_blocks=48 (block_size 16, the null block included) "
                     f"max_concurrency_at_full_length={usable // (128 // 16)} plan: {plan.describe()}"]
    assert plan.describe().startswith("platform=cpu attention=xla")


# ----- block sizes ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llm16():
    return tiny()


@pytest.fixture(scope="module")
def reference_tokens(llm16):
    return [o.outputs[0].token_ids for o in llm16.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("block_size,backend", [
    (8, "xla"), (32, "xla"), pytest.param(64, "xla", marks=pytest.mark.slow),
    pytest.param(128, "xla", marks=pytest.mark.slow), pytest.param(8, "pallas", marks=pytest.mark.slow),
    pytest.param(32, "pallas", marks=pytest.mark.slow)])
def test_other_block_sizes_give_the_same_greedy_text(reference_tokens, block_size, backend):
    """Same pool in tokens (48 blocks of 16), other page size: same greedy tokens, prefix
    cache included (the second call hits it)."""
    llm = tiny(num_blocks=1 + 47 * 16 // block_size, block_size=block_size, attention_backend=backend)
    for _ in range(2):
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == reference_tokens
    assert llm.engine.runner.kv_shape[2] == block_size


def test_unsupported_block_size_is_refused():
    with pytest.raises(ValueError, match="block_size must be one of 8, 16, 32, 64, 128"):
        CacheConfig(block_size=12)


# ----- tokenizer from another folder --------------------------------------------------------
def test_tokenizer_from_another_folder(tmp_path, smollm2_dir):
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, tok_dir / name)
    (tmp_path / "model.json").write_text(__import__("json").dumps(CFG.to_hf_dict()))
    original = api_tokenizer()
    text = "Hello, paged attention!"
    _, _, tok, _ = load_model(EngineConfig(model_path=str(tmp_path / "model.json"), tokenizer=str(tok_dir)), "dummy")
    assert tok.encode(text) == original.encode(text)
    llm = tiny(tokenizer=str(tok_dir))
    msgs = [{"role": "user", "content": "hi"}]
    assert llm.get_tokenizer().apply_chat_template(msgs) == original.apply_chat_template(msgs)
    with pytest.raises(ValueError, match="no tokenizer at"):
        tiny(tokenizer=str(tmp_path / "nowhere"))


# ----- progress -------------------------------------------------------------------------------
def test_warmup_reports_every_bucket_and_ends_at_total():
    engine = fake_engine(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256)
    calls = []
    engine.warmup(progress=lambda done, total: calls.append((done, total)))
    total = len(engine.layout.ladders.all_buckets())
    assert total > 1 and calls == [(i, total) for i in range(0, total + 1)]  # 0: before the first (starts the clock)


def test_warmup_progress_times_the_buckets_only(caplog, monkeypatch):
    """The "done in" figure runs from the call before the first bucket, not from the object's
    creation (the engine is built, weights packed, between the two)."""
    clock = iter([100.0, 130.0, 131.0, 132.0])
    monkeypatch.setattr("jaxinfer.engine.warmup_progress.time.monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger="jaxinfer")
    progress = WarmupProgress(use_tqdm=False)  # t = 100
    progress(0, 2)  # t = 130: the warm-up begins
    progress(1, 2)
    progress(2, 2)  # t = 132
    assert [r.getMessage() for r in caplog.records][-1] == "warm-up: 2/2 buckets, done in 2.0 s"


def test_warmup_progress_logs_at_a_modest_rate(caplog):
    caplog.set_level(logging.INFO, logger="jaxinfer")
    progress = WarmupProgress(use_tqdm=False)
    for i in range(1, 101):
        progress(i, 100)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("warm-up: ")]
    assert 2 <= len(lines) <= 11 and lines[-1].startswith("warm-up: 100/100 buckets, done in")
    assert "ETA" in lines[0]
    assert WarmupProgress.eta_text(12, 77, 12.0) == "ETA 65 s"  # 1 s per bucket so far, 65 left


def test_llm_shows_the_warmup_bar(monkeypatch):
    bars = recording_tqdm(monkeypatch, "jaxinfer.engine.warmup_progress")
    monkeypatch.setattr("jaxinfer.runner.model_runner.ModelRunner.compile", lambda self, inputs: None)  # bar only
    llm = tiny(warmup=True, use_tqdm=True)
    total = len(llm.engine.layout.ladders.all_buckets())
    assert [(b.total, b.n, b.kwargs["disable"]) for b in bars] == [(total, total, False)]


def recording_tqdm(monkeypatch, module):
    bars = []

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.n, self.kwargs, self.updates = total, 0, kwargs, []
            bars.append(self)

        def update(self, k=1):
            self.n += k
            self.updates.append(k)

        def close(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(f"{module}.tqdm", Bar)
    return bars


def test_generate_progress_counts_prompts_not_sequences(llm16, monkeypatch):
    llm = llm16
    bars = recording_tqdm(monkeypatch, llm_mod.__name__)
    sp = SamplingParams(n=3, temperature=0.0, max_tokens=3, ignore_eos=True)
    outs = llm.generate(PROMPTS[:2], sp, use_tqdm=True)
    assert [len(o.outputs) for o in outs] == [3, 3]
    assert (bars[0].total, bars[0].n, bars[0].updates) == (2, 2, [1, 1])  # 2 prompts of 6 sequences
