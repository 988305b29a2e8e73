"""``python -m jaxinfer.plan --compile``: the engine's real step compiled with abstract weights and
KV on the fake CPU devices, checked for the expected communication and memory
(`jaxinfer.engine.step_check`), on a small config at TP 1 / 2 / 4 and DP 2 x TP 2, and the
check failing when a weight is replicated or the hidden states are laid out differently."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import pytest
from helpers import tiny_config
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxinfer.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from jaxinfer.distributed import hlo_collectives, sharding
from jaxinfer.engine import step_check

CFG = tiny_config(vocab=512, hidden=128, layers=2, heads=8, kv_heads=4, inter=256)
MEMORY = 1 << 30


def config(tp: int, dp: int = 1, dtype: str = "bfloat16") -> EngineConfig:
    return EngineConfig(model_path="tiny", dtype=dtype, parallel=ParallelConfig(tp, dp),
                        cache=CacheConfig(num_blocks=64),
                        scheduler=SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32))


def check(tp, dp=1, buckets=("decode",), cuda=False, cfg=CFG, sampler=False):
    """One check, on the decode bucket by default, without CUDA lowering or the sampler (each
    compile costs seconds here; the first test and the CLI test take those)."""
    return step_check.check_step(cfg, config(tp, dp), MEMORY, model_name="tiny", cuda=cuda, buckets=buckets,
                                 sampler=sampler)


def test_dp2_tp2_reduces_the_hidden_states_twice_per_layer_within_a_replica_and_lowers_for_cuda():
    """DP 2 x TP 2: replica 0's step (the program a TP 2 engine runs) on devices 0 and 1 only,
    two all-reduces of [T, D] per layer over them, the split weights and KV; replica 1 on 2 and 3;
    the CUDA lowering holds the Pallas (Triton) kernel."""
    r = check(2, dp=2, cuda=True)
    assert r.ok, step_check.format_report(r)
    assert r.replica_devices == [[0, 1], [2, 3]]
    b, T = r.buckets[0], 8
    assert [x.name for x in r.buckets] == ["decode"]  # the prefill bucket: the slow 8B / 70B runs
    assert b.bucket.num_tokens == T and b.bucket.ctx_blocks == 16  # 256 tokens / 16
    assert b.devices == [0, 1]
    assert [c.kind for c in b.per_layer] == ["all-reduce", "all-reduce"]
    assert all(hlo_collectives._array_dims(c.shape)[0] == [T, 128] for c in b.per_layer)
    assert all(c.groups == ((0, 1),) and not c.weight for c in b.collectives)
    assert b.kv_heads_per_device == 2 and b.weight_bytes == r.expected_weight_bytes
    kv_dev = sharding.kv_heads_per_device(CFG, 2)
    assert b.kv_bytes == r.planner_kv_bytes == 2 * CFG.num_hidden_layers * 64 * 16 * kv_dev * CFG.head_dim * 2
    assert abs(b.memory["argument"] / (r.planner_weight_bytes + r.planner_kv_bytes) - 1) < 0.01
    assert b.cuda["lowered"] and any("triton" in k for k in b.cuda["custom_calls"])  # the Pallas kernel
    assert r.verdict().startswith("PASS TP 2 x DP 2: 2 all-reduce per layer")


def test_tp4():
    r4 = check(4)
    assert r4.ok, step_check.format_report(r4)
    assert r4.buckets[0].kv_heads_per_device == 1 and len(r4.buckets[0].per_layer) == 2
    assert r4.buckets[0].per_layer[0].groups == ((0, 1, 2, 3),)


def test_expert_parallel_step_combines_the_experts_with_one_all_reduce_per_layer():
    """A tiny Mixtral at EP 2 x TP 2 (the experts halved over ``expert``, their width over ``model``):
    no all-to-all; per layer the attention's reduction and the experts' combine, each one all-reduce
    of T * D * 4 bytes over the 4 devices (`jaxinfer.models.moe_block`'s model); the weights split
    4 ways. (Its CUDA lowering passed too, in a run too slow for this suite.)"""
    from moe_helpers import MIXTRAL

    cfg = ModelConfig.from_dict(dict(MIXTRAL["config"], model_type="mixtral", hidden_size=128,
                                     num_attention_heads=8, num_key_value_heads=4, intermediate_size=128))
    config = EngineConfig(model_path="mixtral-tiny", dtype="bfloat16",
                          parallel=ParallelConfig(4, 1, enable_expert_parallel=True, expert_parallel_size=2),
                          cache=CacheConfig(num_blocks=64),
                          scheduler=SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=32))
    r = step_check.check_step(cfg, config, MEMORY, model_name="mixtral-tiny", cuda=False, buckets=("decode",),
                              sampler=False)
    assert r.ok, step_check.format_report(r)
    b = r.buckets[0]
    assert [c.kind for c in b.per_layer] == ["all-reduce", "all-reduce"]
    assert all(c.bytes == 8 * 128 * 4 and c.groups == ((0, 1, 2, 3),) for c in b.per_layer)
    assert "moe" in b.per_layer[1].op_name and not any(c.kind == "all-to-all" for c in b.collectives)
    assert step_check.expected_weight_bytes(cfg, "bfloat16", 4, 2) == b.weight_bytes
    assert step_check.expected_weight_bytes(cfg, "bfloat16", 4, 1) == b.weight_bytes  # EP or TP: 1/4 either way
    assert "(EP 2)" in r.verdict() and "combined by one all-reduce" in r.verdict()


def test_replicated_kv_heads_stay_in_place():
    """K = 4 KV heads at TP 8: the cache holds all 4 on every device (sharding's fallback), and no
    collective moves it (`AttentionBackend.keep_layout` pins the new K/V and the written pages)."""
    r = check(8)
    assert r.ok, step_check.format_report(r)
    assert r.buckets[0].kv_heads_per_device == 4 and "KV replicated (all 4 heads" in r.verdict()


def _temp_growth(tp: int, blocks=(64, 1024)) -> tuple[int, int]:
    """(XLA's temporary bytes at ``blocks[1]`` minus at ``blocks[0]``, the KV bytes per device
    between them) of the decode step at ``tp``."""
    temps, kv = [], []
    for nb in blocks:
        c = dataclasses.replace(config(tp), cache=CacheConfig(num_blocks=nb))
        b = step_check.check_step(CFG, c, MEMORY, model_name="tiny", cuda=False, sampler=False).buckets[0]
        temps.append(b.memory["temp"])
        kv.append(b.kv_bytes)
    return temps[1] - temps[0], kv[1] - kv[0]


@pytest.mark.parametrize("pinned", [True, False])
def test_replicated_kv_pages_are_read_without_a_copy_of_the_cache(monkeypatch, pinned):
    """K = 4 at TP 8 (the cache replicated): the XLA path's temporaries do not grow with the pool.
    Without the pin on the pages it reads (`jaxinfer.layers.attention.xla`), XLA sliced each
    device's KV head out of the whole [L, NB, ...] cache every layer: temporaries of 1/K of the
    cache (Qwen3-30B-A3B at TP 8: 17 GB per device)."""
    from jaxinfer.layers.attention import xla

    if not pinned:
        monkeypatch.setattr(xla, "_pinned", lambda pin, pages: pages)
    growth, kv = _temp_growth(8)
    if pinned:
        assert growth < kv // 64, (growth, kv)
    else:
        assert growth >= kv // 8, (growth, kv)  # the copy: K and V, one of the 4 heads each


def test_check_fails_when_replicated_kv_is_left_to_the_partitioner(monkeypatch):
    """Without the pins (the engine before the check found it), XLA split the updated cache like
    the grouped queries and all-gathered the whole cache every step: the check names it."""
    from jaxinfer.layers.attention.base import AttentionBackend

    monkeypatch.setattr(AttentionBackend, "keep_layout", lambda self, pages: pages)
    r = check(8)
    assert not r.ok
    assert any("of the KV cache or its update" in p for p in r.buckets[0].problems), step_check.format_report(r)


def test_check_fails_when_a_weight_is_replicated(monkeypatch):
    """o_proj's spec set to replicate it: each device holds all of it (weights per device off the
    split figure) and the attention output is gathered instead of reduced."""
    real = sharding.param_partition_specs

    def replicate_o_proj(cfg, tp, *ep):
        specs = real(cfg, tp, *ep)
        specs["layers"]["attn"]["o_proj"]["kernel"] = P()
        return specs

    monkeypatch.setattr(sharding, "param_partition_specs", replicate_o_proj)
    r = check(2)
    assert not r.ok and r.verdict().startswith("FAIL TP 2")
    problems = " | ".join(r.buckets[0].problems)
    assert "weights per device 460,032 B, expected 427,264 B" in problems  # XLA slices o_proj locally: same collectives


def test_check_fails_when_the_hidden_states_are_not_replicated(monkeypatch):
    """The normed hidden states constrained to be split over D on the model axis (the layout a
    missing or wrong constraint would let XLA pick): extra per-layer collectives, a FAIL."""
    from jaxinfer.models import llama

    real = llama.RMSNorm.__call__
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("model",))

    def split_over_d(self, x):
        y = real(self, x)
        return jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P(None, "model"))) if y.ndim == 2 else y

    monkeypatch.setattr(llama.RMSNorm, "__call__", split_over_d)
    r = check(2)
    assert not r.ok
    assert any("unexpected per-layer" in p or "of the hidden states" in p for p in r.buckets[0].problems)


def test_weight_origin_follows_loop_state_and_slices():
    """A hand-written partitioned module: an all-gather of a dynamic slice of a loop-carried entry
    parameter named as a weight is flagged; an all-reduce of a dot is not; replica-group forms."""
    hlo = """HloModule m

%body (p: (s32[], f32[2,4,8], f32[3,4])) -> (s32[], f32[2,4,8], f32[3,4]) {
  %p = (s32[], f32[2,4,8]{2,1,0}, f32[3,4]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = f32[2,4,8]{2,1,0} get-tuple-element(%p), index=1
  %x = f32[3,4]{1,0} get-tuple-element(%p), index=2
  %z = s32[] constant(0)
  %ds = f32[1,4,8]{2,1,0} dynamic-slice(%w, %i, %z, %z), dynamic_slice_sizes={1,4,8}
  %bc = f32[4,8]{1,0} bitcast(%ds)
  %ag = f32[4,16]{1,0} all-gather(%bc), channel_id=1, replica_groups=[1,2]<=[2], dimensions={1}
  %d = f32[3,16]{1,0} dot(%x, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar = f32[3,16]{1,0} all-reduce(%d), channel_id=2, replica_groups={{0,1}}, to_apply=%add
  ROOT %t = (s32[], f32[2,4,8]{2,1,0}, f32[3,4]{1,0}) tuple(%i, %w, %x)
}

ENTRY %main (a: f32[2,4,8], b: f32[3,4]) -> f32[3,4] {
  %a = f32[2,4,8]{2,1,0} parameter(0), metadata={op_name="variables['params']['layers']['mlp']['up_proj']['kernel']"}
  %b = f32[3,4]{1,0} parameter(1), metadata={op_name="token_ids"}
  %c = s32[] constant(0)
  %t0 = (s32[], f32[2,4,8]{2,1,0}, f32[3,4]{1,0}) tuple(%c, %a, %b)
  %wl = (s32[], f32[2,4,8]{2,1,0}, f32[3,4]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"2"}}
  %cp = f32[3,4]{1,0} collective-permute(%b), channel_id=3, source_target_pairs={{0,1},{1,0}}
  %kv = u16[2,5,4]{2,1,0} parameter(2), metadata={op_name="k_cache"}
  %kvc = u16[2,5,4]{2,1,0} copy(%kv)
  %kvg = u16[2,5,8]{2,1,0} all-gather(%kvc), channel_id=4, replica_groups={{0,1}}, dimensions={2}
  ROOT %r = f32[3,4]{1,0} get-tuple-element(%wl), index=2
}
"""
    got = hlo_collectives.collectives(hlo, num_layers=2)
    by_kind = {c.kind: c for c in got if c.weight != "k_cache"}
    assert [c.kind for c in got if c.weight == "k_cache"] == ["all-gather"]  # the KV cache gathered: flagged too
    assert by_kind["all-gather"].weight == "variables['params']['layers']['mlp']['up_proj']['kernel']"
    assert by_kind["all-gather"].groups == ((0, 1),) and by_kind["all-gather"].bytes == 4 * 16 * 4
    assert by_kind["all-reduce"].weight == "" and by_kind["all-reduce"].groups == ((0, 1),)
    # the while carries no [L, ...] 5-D cache here, so it is an ordinary loop: 2 trips
    assert by_kind["all-reduce"].count == 2 and not by_kind["all-reduce"].per_layer
    assert by_kind["collective-permute"].count == 1 and by_kind["collective-permute"].groups == ((0, 1), (1, 0))


def test_replica_group_forms():
    ins = lambda attrs: hlo_collectives.Instr("x", "f32[2]", "all-reduce", [], attrs)  # noqa: E731
    assert hlo_collectives.replica_groups(ins(", replica_groups=[2,2]<=[4]")) == ((0, 1), (2, 3))
    assert hlo_collectives.replica_groups(ins(", replica_groups=[2,2]<=[2,2]T(1,0)")) == ((0, 2), (1, 3))
    assert hlo_collectives.replica_groups(
        ins(", replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_1'}, x=1")) == ((0, 1), (2, 3))
    assert hlo_collectives.replica_groups(
        ins(", replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, x=1")) == ((0, 2), (1, 3))


def test_plan_cli_compile_json_at_tp1(capsys, tmp_path):
    """The command line at TP 1 (a one-device mesh): ``--compile --json`` carries the report, exit 0
    on a PASS; no collective in the step or the sampler."""
    from jaxinfer.entrypoints import plan
    from helpers import tiny_hf_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(tiny_hf_config(num_attention_heads=8, num_key_value_heads=4, head_dim=8)))
    code = plan.main(["--model", str(path), "--devices", "8", "--device-memory", "1GiB", "--tensor-parallel-size", "1",
                      "--data-parallel-size", "1", "--max-model-len", "256", "--max-num-seqs", "8",
                      "--max-num-batched-tokens", "32", "--num-blocks", "64", "--compile", "--no-cuda",
                      "--buckets", "decode", "--json"])
    out = json.loads(capsys.readouterr().out)
    rep = out["compile"]
    assert code == 0 and rep["ok"] and rep["verdict"].startswith("PASS TP 1 x DP 1: no collective per layer")
    assert out["num_blocks"] == rep["num_blocks"] == 64
    b = rep["buckets"][0]
    assert b["collectives"] == [] and b["sampler_checked"] and b["sampler_collectives"] == [] and b["devices"] == [0]


CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _acceptance(path: str, tp: int, dp: int) -> step_check.CompileReport:
    """The issue's acceptance for one layout at full size (bfloat16, max_model_len 4096, the
    server's default buckets, 80 GiB devices): compiles; weights per device within 1% of
    (all weights but the norms) / TP + the norms; XLA's argument bytes within 10% of the planner's;
    no weight in any collective; two all-reduces of [T, D] per layer (none at TP 1); the CUDA
    lowering of the Pallas step succeeds."""
    from jaxinfer.entrypoints.plan import load_config
    from jaxinfer.models.params import abstract_params

    cfg = load_config(str(CONFIGS / path))
    config = EngineConfig(model_path=path, dtype="bfloat16", parallel=ParallelConfig(tp, dp),
                          scheduler=SchedulerConfig(max_model_len=4096))
    r = step_check.check_step(cfg, config, 80 * 2**30, model_name=path)
    assert r.ok, step_check.format_report(r)
    leaves = jax.tree_util.tree_leaves_with_path(abstract_params(cfg, "bfloat16"))
    norms = sum(x.size * 2 for p, x in leaves if "norm" in jax.tree_util.keystr(p))
    total = sum(x.size * 2 for _, x in leaves)
    for b in r.buckets:
        assert abs(b.weight_bytes - ((total - norms) / tp + norms)) <= 0.01 * total / tp
        assert abs(b.memory["argument"] / (r.planner_weight_bytes + r.planner_kv_bytes) - 1) <= 0.10
        assert not any(c.weight for c in b.collectives + b.sampler_collectives)
        T, D = b.bucket.num_tokens, cfg.hidden_size
        want = [] if tp == 1 else ["all-reduce", "all-reduce"]
        assert [c.kind for c in b.per_layer] == want
        assert all(hlo_collectives._array_dims(c.shape)[0] == [T, D] for c in b.per_layer)
        assert b.cuda["lowered"]
    assert [b.bucket.num_tokens for b in r.buckets] == [128, 512]  # max_num_seqs, max_num_batched_tokens
    return r


@pytest.mark.slow
def test_llama3_70b_tp8_compiles_as_planned():
    r = _acceptance("llama-3-70b.json", 8, 1)
    assert r.buckets[0].kv_heads_per_device == 1


@pytest.mark.slow
@pytest.mark.parametrize("tp,dp", [(1, 1), (2, 1), (4, 2)])
def test_llama3_8b_compiles_as_planned(tp, dp):
    r = _acceptance("llama-3-8b.json", tp, dp)
    assert r.replica_devices == [list(range(i * tp, (i + 1) * tp)) for i in range(dp)]


def test_compile_refuses_more_devices_than_a_started_jax_has():
    """In a process whose JAX already started with 8 CPU devices, asking for 16 is a clear exit,
    not a wrong-sized mesh."""
    from jaxinfer.entrypoints import plan

    with pytest.raises(SystemExit, match="needs 16 CPU devices"):
        plan.main(["--model", str(CONFIGS / "llama-3-8b.json"), "--devices", "16", "--device-memory", "80GiB",
                   "--tensor-parallel-size", "16", "--compile"])
