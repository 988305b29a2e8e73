"""The one flag table (`jaxinfer.config.args.FLAGS`): server.py's parser, `LLM`'s keyword
defaults, the planner's flags and the cluster launcher all take their flags from it."""
from __future__ import annotations

import argparse
import inspect
import sys

import pytest

from api_helpers import REPO, model_config
from jaxinfer.entrypoints import plan
from jaxinfer.cluster import cli as cluster_cli
from jaxinfer.config import args as engine_args
from jaxinfer.config import QUANTIZATIONS, EngineConfig
from jaxinfer.config.args import DEFAULT_MODEL, FLAGS, add_engine_args, engine_config, flag, llm_defaults
from jaxinfer.entrypoints.llm import LLM, OFFLINE_MAX_QUEUE_LEN

sys.path.insert(0, str(REPO))
import server  # noqa: E402


def actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings[0] != "-h"}


def test_server_parser_is_the_table():
    got = actions(server.build_parser())
    assert list(got) == [f.name for f in FLAGS]
    for f in FLAGS:
        a = got[f.name]
        assert (a.dest, a.default, a.help, a.metavar) == (f.dest, f.default, f.help, f.metavar)
        assert (tuple(a.choices) if a.choices else None) == f.choices
        if f.type is not None:
            assert a.type is f.type


def test_llm_keyword_defaults_are_the_flags():
    sig = inspect.signature(LLM.__init__).parameters
    for name, default in llm_defaults().items():
        if name == "model":
            assert sig[name].default == DEFAULT_MODEL
        elif name == "max_queue_len":  # offline: a call queues every prompt at once
            assert sig[name].default == OFFLINE_MAX_QUEUE_LEN
        else:
            assert sig[name].default == default, name


def test_defaults_give_the_configs_defaults():
    """With every flag at its default, the engine configuration is EngineConfig's own (but
    for the fields the server fills in: model, dtype auto, max_model_len from the model)."""
    cfg = engine_config(argparse.Namespace(), model_config())
    ref = EngineConfig(model_path=DEFAULT_MODEL, dtype="auto", scheduler=cfg.scheduler)
    assert cfg == ref
    assert cfg.scheduler.max_model_len == min(4096, model_config().max_position_embeddings)
    assert engine_config(server.build_parser().parse_args([]), model_config()) == cfg


def test_planner_and_launcher_share_the_names_and_choices():
    p = argparse.ArgumentParser()
    add_engine_args(p, only=plan.PLAN_FLAGS, titled=False)
    planner = actions(p)
    for dest in plan.PLAN_FLAGS:
        assert flag(dest).name in planner
    assert tuple(planner["--quantization"].choices) == QUANTIZATIONS == flag("quantization").choices
    launcher = actions(cluster_cli.build_parser())
    assert (launcher["--host"].default, launcher["--port"].default) == (flag("host").default, flag("port").default)


def test_an_unknown_llm_keyword_is_a_key_error():
    with pytest.raises(KeyError):
        engine_args.llm_namespace({"no_such_keyword": 1})
