"""The execution plan (`jaxinfer.platform`) and the linear-method registry (`jaxinfer.layers.linear`).

References: the rules written out by hand per platform, dtype, quantization, mesh and
environment (with every kernel switched off, no kernel library is asked about, so these run on
any host); the parameter tree of the model built without a plan (what checkpoints hold); and
the import graph the issue asked for (the model imports no kernel, the kernels no model).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import tiny_config

from jaxinfer.layers.attention.xla import XlaAttention
from jaxinfer.layers.linear import get_linear_method
from jaxinfer.models.llama import LlamaForCausalLM
from jaxinfer.models.params import _dummy_call_args
from jaxinfer.platform.execution_plan import ExecutionPlan, resolve_plan
from jaxinfer.platform.execution_plan import NATIVE_SWITCHES, UNROLL_ENV_VAR

OFF = {switch: "0" for switch in NATIVE_SWITCHES.values()}  # no kernel asked about
CFG = tiny_config(vocab=256, hidden=64, layers=2, inter=96, tied=True)
INT8 = dataclasses.replace(CFG, quantization="int8")
ROOT = Path(__file__).resolve().parents[1] / "jaxinfer"


def _plan(cfg=CFG, dtype="bfloat16", platform="cpu", environ=OFF, **kw) -> ExecutionPlan:
    return resolve_plan(cfg, dtype, platform=platform, cpu_flags=frozenset(), environ=environ, **kw)


def test_gpu_plan_runs_xla_products_and_pallas():
    plan = _plan(platform="gpu", environ={})
    assert (plan.attention, plan.native_attention, plan.pallas_interpret) == ("pallas", False, False)
    assert (plan.linear, plan.linear_fallback, plan.prompt_head) == ("dense", None, "dense")
    assert not (plan.native_argmax or plan.native_gemv or plan.bf16_bits or plan.packed)
    assert plan.unroll_max_tokens == 0


def test_cpu_plan_without_kernels():
    plan = _plan()
    assert (plan.attention, plan.native_attention) == ("xla", False)
    assert (plan.linear, plan.prompt_head, plan.bf16_bits, plan.unroll_max_tokens) == ("dense_cpu", "dense_cpu", True, 1)
    assert _plan(dtype="float32").bf16_bits is False
    assert _plan(attention="pallas").pallas_interpret is True
    assert _plan(environ={**OFF, UNROLL_ENV_VAR: "0"}).unroll_max_tokens == 0
    assert _plan(unroll_max_tokens=3).unroll_max_tokens == 3


def test_int8_plan_and_the_mesh():
    plan = _plan(INT8, "float32")
    assert (plan.linear, plan.linear_fallback, plan.prompt_head) == ("int8", None, "int8")
    sharded = _plan(sharded=True, environ={})  # kernels on: still none on a mesh
    assert not (sharded.native_attention or sharded.native_argmax or sharded.native_gemv or sharded.packed)
    assert sharded.linear == "dense_cpu"
    with pytest.raises(ValueError, match="attention backend"):
        _plan(attention="flash")


def test_describe_names_the_choices():
    plan = dataclasses.replace(_plan(), linear="amx_packed", linear_fallback="bf16_gemv", native_attention=True,
                               native_argmax=True, instruction_set="AVX-512 BF16, VDPBF16PS")
    line = plan.describe()
    assert "platform=cpu" in line and "attention=xla+native" in line and "linear=amx_packed(bf16_gemv)" in line
    assert "argmax=native" in line and "unroll=1" in line and "isa=AVX-512BF16/VDPBF16PS" in line


def test_registry_builds_methods_by_name():
    for name in ("dense", "dense_cpu", "bf16_gemv", "int8"):
        method = get_linear_method(name)
        assert method.name == name and hash(method) == hash(get_linear_method(name))
    packed = get_linear_method("amx_packed", "bf16_gemv")
    assert packed.fallback == get_linear_method("bf16_gemv")
    with pytest.raises(ValueError, match="fallback"):
        get_linear_method("int8_packed")
    with pytest.raises(ValueError, match="unknown linear method"):
        get_linear_method("fp4")


@pytest.mark.parametrize("cfg,names", [(CFG, ("dense_cpu", "bf16_gemv", "amx_packed")),
                                       (dataclasses.replace(CFG, tie_word_embeddings=False), ("bf16_gemv",)),
                                       (INT8, ("int8_packed",))])
def test_every_method_makes_the_checkpoint_tree(cfg, names):
    """The same parameter names, shapes, dtypes and logical axes as the model built without a
    plan (the tree `jaxinfer.models.params` initialises and checkpoints hold)."""
    def tree(linear):
        model = LlamaForCausalLM(cfg, XlaAttention(), jnp.bfloat16, jnp.bfloat16, linear=linear)
        return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), *_dummy_call_args(cfg))["params"])

    reference = tree(None)
    for name in names:
        fallback = "int8" if cfg.quantization else "bf16_gemv"
        assert tree(get_linear_method(name, fallback)) == reference, name


def test_the_runner_asks_no_hardware_question():
    """The runner reads the plan only (the models' and kernels' imports: tests/test_layering.py)."""
    runner = (ROOT / "runner" / "model_runner.py").read_text()
    assert "use_native_" not in runner and "default_backend" not in runner and "cpu_features" not in runner
