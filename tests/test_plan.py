"""The memory planner and the engine's KV-pool sizing against hand calculations."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import flax.linen as nn
import jax
import pytest
from helpers import tiny_config

from jaxinfer.entrypoints import plan
from jaxinfer.distributed import sharding
from jaxinfer.engine.builder import kv_bytes_per_block, plan_num_blocks
from jaxinfer.config import CacheConfig, ModelConfig

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def llama70b() -> ModelConfig:
    return plan.load_config(str(CONFIGS / "llama-3-70b.json"))


def test_llama3_configs_have_the_published_shapes():
    c8 = plan.load_config(str(CONFIGS / "llama-3-8b.json"))
    c70 = llama70b()
    got = lambda c: (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads,  # noqa: E731
                     c.intermediate_size, c.vocab_size, c.rope_theta, c.head_dim, c.tie_word_embeddings)
    assert got(c8) == (4096, 32, 32, 8, 14336, 128256, 500000.0, 128, False)
    assert got(c70) == (8192, 80, 64, 8, 28672, 128256, 500000.0, 128, False)


# Llama-3-70B by hand: V 128256, D 8192, L 80, N 64, K 8, H 128, F 28672, untied.
V, D, L, N, K, H, F = 128256, 8192, 80, 64, 8, 128, 28672
PARAMS = (2 * V * D  # embedding + LM head
          + L * (D * N * H + 2 * D * K * H + N * H * D)  # q, k, v, o
          + L * 3 * D * F  # gate, up, down
          + 2 * L * D + D)  # norms
NORMS = 2 * L * D + D
PER_DEVICE_TP8 = (PARAMS - NORMS) // 8 + NORMS  # everything but the norms splits 8 ways
assert PARAMS == 70_553_706_496 and PER_DEVICE_TP8 == 8_820_367_360


# The activation estimate of the server's defaults (512 tokens, 128 sequences) for 70B, by hand
# (`jaxinfer.engine.builder.activation_reserve_bytes`): one layer's float32 activations, doubled,
# the sampler's logits copies and a 256 MiB workspace.
ACT70 = 2 * 512 * (4 * D + 2 * F + (N + 2 * K) * H) * 4 + 4 * 128 * V * 4 + (256 << 20)
assert ACT70 == 942_145_536


def test_planner_llama3_70b_on_8x80gb_bf16_tp8_by_hand(capsys):
    p = plan.plan_memory(llama70b(), dtype="bfloat16", tensor_parallel_size=8, device_memory=80 * 10**9,
                         max_model_len=4096)
    weights = PER_DEVICE_TP8 * 2  # bf16
    per_block = 2 * L * 16 * (K // 8) * H * 2  # K and V, one KV head per device
    blocks = (int(80e9 * 0.9) - weights - ACT70) // per_block
    assert p.total_param_bytes == PARAMS * 2
    assert p.weight_bytes_per_device == weights == 17_640_734_720
    assert p.kv_bytes_per_block_per_device == per_block == 655_360
    assert p.activation_reserve_bytes == ACT70
    assert p.num_blocks == blocks == 81_508
    assert p.blocks_per_sequence == 4096 // 16 == 256
    assert p.max_concurrent_sequences == (blocks - 1) // 256 == 318
    assert p.replicated_axes == ()
    # the CLI prints the same numbers (default gpu_memory_utilization 0.9); half of it by the flag
    assert plan.main(["--model", str(CONFIGS / "llama-3-70b.json"), "--devices", "8",
                      "--device-memory", "80000000000", "--tensor-parallel-size", "8", "--dtype", "bfloat16",
                      "--max-model-len", "4096", "--gpu-memory-utilization", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    half_blocks = (40_000_000_000 - weights - ACT70) // per_block
    assert (out["weight_bytes_per_device"], out["kv_bytes_per_block_per_device"], out["num_blocks"],
            out["max_concurrent_sequences"]) == (weights, per_block, half_blocks, (half_blocks - 1) // 256)
    assert (half_blocks, (half_blocks - 1) // 256) == (32_679, 127)


def test_planner_and_server_size_kv_by_one_rule(capsys):
    """The same flags give the same pool in both: the planner calls the server's
    `size_kv_pool` with the memory it is told, and prints the server's sentence."""
    from jaxinfer.config import SchedulerConfig
    from jaxinfer.engine.builder import size_kv_pool

    cfg, memory = llama70b(), 80 * 2**30
    for flags, cache, sched in (
            ((), CacheConfig(), SchedulerConfig(max_model_len=4096)),
            (("--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "2048", "--max-num-seqs", "256"),
             CacheConfig(gpu_memory_utilization=0.8), SchedulerConfig(max_model_len=4096, max_num_batched_tokens=2048,
                                                                      max_num_seqs=256)),
            (("--kv-cache-memory", "20GiB"), CacheConfig(kv_cache_memory=20 * 2**30), SchedulerConfig(max_model_len=4096)),
            (("--num-blocks", "1000"), CacheConfig(num_blocks=1000), SchedulerConfig(max_model_len=4096))):
        assert plan.main(["--model", str(CONFIGS / "llama-3-70b.json"), "--devices", "8", "--device-memory", "80GiB",
                          "--tensor-parallel-size", "8", "--json", *flags]) == 0
        out = json.loads(capsys.readouterr().out)
        weights = sharding.per_device_param_bytes(cfg, "bfloat16", 8)
        n, per_block, why = size_kv_pool(cfg, cache, "bfloat16", weights, 8, sched, 8, memory)
        assert (out["num_blocks"], out["kv_bytes_per_block_per_device"], out["kv_sizing"]) == (n, per_block, why)
        assert plan_num_blocks(cfg, cache, "bfloat16", weights, 8, sched, 8, memory) == (n, why)


def test_planner_says_when_it_does_not_fit(capsys):
    assert plan.main(["--model", str(CONFIGS / "llama-3-70b.json"), "--devices", "1", "--device-memory", "80GiB",
                      "--tensor-parallel-size", "1"]) == 1
    out = capsys.readouterr().out
    assert "DOES NOT FIT" in out
    assert "--tensor-parallel-size 2, more devices than --devices 1" in out  # see the test below


def test_parse_bytes():
    assert plan.parse_bytes("80GB") == 80 * 2**30  # binary, as server.py reads it
    assert plan.parse_bytes("80GiB") == 80 * 2**30
    assert plan.parse_bytes("1.5 MiB") == 3 * 2**19
    assert plan.parse_bytes("4096") == 4096
    with pytest.raises(ValueError):
        plan.parse_bytes("80 GQ")


def test_server_and_planner_read_a_size_alike():
    """One reading of "80GB" on every command line: the planner and the server sized the same
    string 7% apart when the planner read decimal units."""
    import sys

    sys.path.insert(0, str(CONFIGS.parent))
    import server

    assert plan.parse_bytes("80GB") == server.parse_bytes("80GB") == 80 * 2**30
    args = server.build_parser().parse_args(["--kv-cache-memory", "80GB"])
    assert args.kv_cache_memory == plan.parse_bytes("80GB")


def test_replicated_kv_heads_cost_a_full_block_per_device():
    smol = tiny_config(vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, inter=1536)
    full = 2 * 30 * 16 * 3 * 64 * 4
    assert kv_bytes_per_block(smol, 16, "float32") == full
    assert kv_bytes_per_block(smol, 16, "float32", 2) == full  # 3 KV heads do not split over 2
    assert kv_bytes_per_block(smol, 16, "float32", 3) == full // 3


def test_engine_pool_sizing_is_per_device():
    cfg = tiny_config(heads=8, kv_heads=4)  # L 2, H 8
    per_block_tp4 = 2 * 2 * 16 * 1 * 8 * 4
    n, why = plan_num_blocks(cfg, CacheConfig(kv_cache_memory=1 << 20), "float32", tensor_parallel_size=4)
    assert n == (1 << 20) // per_block_tp4 and "per device" in why
    n1, _ = plan_num_blocks(cfg, CacheConfig(kv_cache_memory=1 << 20), "float32")
    assert n == 4 * n1


def test_dummy_init_of_llama3_70b_is_born_sharded():
    """The jitted dummy init with out_shardings, compiled (not run) for TP 8: each device
    outputs exactly the planner's weight bytes, and its scratch stays far below the
    full model (no device ever holds a full copy)."""
    cfg = llama70b()
    mesh = sharding.make_mesh(8, 1)
    from jaxinfer.models.params import _boxed_init

    init = jax.jit(lambda: nn.unbox(_boxed_init(cfg, "bfloat16", 0)), out_shardings=sharding.param_shardings(cfg, mesh))
    mem = init.lower().compile().memory_analysis()
    planned = sharding.per_device_param_bytes(cfg, "bfloat16", 8)
    assert planned == PER_DEVICE_TP8 * 2
    assert abs(mem.output_size_in_bytes - planned) <= 4096  # allocator alignment only
    assert mem.temp_size_in_bytes < PARAMS * 2 / 8


def test_planner_suggests_the_smallest_tp_that_fits(capsys):
    """70B bf16 on 80 GiB devices at gpu_memory_utilization 0.5: the budget is 40 GiB per device
    less the activations. By hand, TP 2 keeps 70.5e9 weight bytes per device (> 42.9e9: no
    room), TP 4 about 35.3e9 and leaves KV room for whole 4096-token sequences: TP 4 is the
    answer."""
    cfg, budget = llama70b(), int(80 * 2**30 * 0.5) - ACT70
    weights = {tp: (PARAMS - NORMS) // tp * 2 + NORMS * 2 for tp in (1, 2, 4, 8)}
    fits = [tp for tp in (1, 2, 4, 8) if (budget - weights[tp]) // (2 * L * 16 * (K // tp) * H * 2) - 1 >= 256]
    assert fits[0] == 4
    assert plan.head_divisible_tp_sizes(cfg) == [1, 2, 4, 8]  # gcd(64, 8) = 8
    args = ["--model", str(CONFIGS / "llama-3-70b.json"), "--device-memory", "80GiB", "--tensor-parallel-size", "1",
            "--gpu-memory-utilization", "0.5"]
    assert plan.main(args + ["--devices", "8", "--json"]) == 1
    got = json.loads(capsys.readouterr().out)
    assert got["suggested_tensor_parallel_size"] == 4 and "more devices" not in got["suggestion"]
    assert plan.smallest_fitting_tp(cfg, max_tp=1, dtype="bfloat16", device_memory=80 * 2**30) is None
    # at the server's default 0.9, TP 2 leaves room too
    assert plan.smallest_fitting_tp(cfg, dtype="bfloat16", device_memory=80 * 2**30).tensor_parallel_size == 2
    assert "no tensor-parallel size" in plan.suggestion(cfg, None, 8) and "1, 2, 4, 8" in plan.suggestion(cfg, None, 8)


def test_head_divisible_tp_sizes_skip_replicating_sizes():
    smol = tiny_config(vocab=49152, hidden=576, layers=30, heads=9, kv_heads=3, inter=1536)
    assert plan.head_divisible_tp_sizes(smol) == [1, 3]  # TP 2 would replicate attention and the KV cache


def test_load_config_can_override_the_depth():
    """Benchmarks run a few layers of a large layout (`--layers`); every other field stays."""
    full = plan.load_config(str(CONFIGS / "llama-3-8b.json"))
    two = plan.load_config(str(CONFIGS / "llama-3-8b.json"), num_hidden_layers=2)
    assert (full.num_hidden_layers, two.num_hidden_layers) == (32, 2)
    assert dataclasses.replace(two, num_hidden_layers=32) == full


@pytest.mark.parametrize("name,total", [
    # V 152064, D 3584, L 28, N 28, K 4, H 128, F 18944, untied; q/k/v biases (D + 2 K H a layer)
    ("qwen2.5-7b-instruct", 2 * 152064 * 3584 + 28 * (2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512)
     + 28 * 3 * 3584 * 18944 + 2 * 28 * 3584 + 3584),
    # V 151936, D 4096, L 36, N 32, K 8, H 128, F 12288, untied; q/k norms (2 H a layer)
    ("qwen3-8b", 2 * 151936 * 4096 + 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 36 * 3 * 4096 * 12288
     + 2 * 36 * 4096 + 4096 + 2 * 36 * 128),
])
def test_planner_sizes_qwen_configs_by_hand(name, total):
    """Qwen2.5-7B (7.6156 B parameters; its model card says 7.61 B) and Qwen3-8B (8.19 B; 8.2 B):
    the biases and q/k norms are counted; at TP 4 the 4 (Qwen2.5) or 8 (Qwen3) KV heads split."""
    cfg = plan.load_config(str(CONFIGS / f"{name}.json"))
    p = plan.plan_memory(cfg, dtype="bfloat16", tensor_parallel_size=4, device_memory=80 * 10**9,
                         max_model_len=4096)
    assert p.total_param_bytes == 2 * total and round(total / 1e9, 2) == {"qwen2.5-7b-instruct": 7.62,
                                                                         "qwen3-8b": 8.19}[name]
    assert p.kv_bytes_per_block_per_device == 2 * cfg.num_hidden_layers * 16 * (cfg.num_key_value_heads // 4) * 128 * 2
