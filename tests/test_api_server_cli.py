"""``server.py`` flags map one-to-one onto the configuration tree; safe defaults (127.0.0.1)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

import pytest

from api_helpers import REPO, model_config

sys.path.insert(0, str(REPO))
import server  # noqa: E402


def test_defaults_bind_loopback():
    args = server.build_parser().parse_args([])
    cfg = server.server_config(args)
    assert (cfg.host, cfg.port, cfg.served_model_name, cfg.api_key) == ("127.0.0.1", 8000, server.DEFAULT_MODEL, None)
    assert cfg.truncate_prompt == "none" and cfg.request_timeout is None


def test_flags_map_onto_config_fields():
    args = server.build_parser().parse_args([
        "--model", "m", "--served-model-name", "served", "--dtype", "bfloat16", "--host", "0.0.0.0", "--port", "9",
        "--max-model-len", "1024", "--kv-cache-memory", "2GiB", "--num-blocks", "77", "--watermark", "0.2",
        "--max-num-seqs", "4", "--max-num-batched-tokens", "256", "--max-queue-len", "5", "--max-queue-wait", "1.5",
        "--request-timeout", "9", "--api-key", "k", "--attention-backend", "pallas", "--truncate-prompt", "left",
        "--load-format", "dummy", "--seed", "3", "--no-warmup", "--shutdown-timeout", "4",
        "--max-request-bytes", "1MiB"])
    s = server.server_config(args)
    assert (s.host, s.port, s.served_model_name, s.api_key, s.max_queue_wait, s.request_timeout,
            s.truncate_prompt, s.shutdown_timeout) == ("0.0.0.0", 9, "served", "k", 1.5, 9.0, "left", 4.0)
    assert s.max_request_bytes == 2**20
    e = server.engine_config(args, model_config())
    assert (e.model_path, e.dtype, e.attention_backend, e.seed, e.warmup) == ("m", "bfloat16", "pallas", 3, False)
    assert (e.cache.num_blocks, e.cache.kv_cache_memory, e.cache.watermark) == (77, 2 * 2**30, 0.2)
    sc = e.scheduler
    assert (sc.max_model_len, sc.max_num_seqs, sc.max_num_batched_tokens, sc.max_queue_len) == (1024, 4, 256, 5)


def test_responses_store_flags():
    from jaxinfer.entrypoints.openai import responses_store as rs

    d = server.server_config(server.build_parser().parse_args([]))
    assert (d.responses_store_max_entries, d.responses_store_max_bytes, d.responses_store_max_age) == (
        rs.DEFAULT_MAX_ENTRIES, rs.DEFAULT_MAX_BYTES, rs.DEFAULT_MAX_AGE_S)  # the flag table's defaults agree
    s = server.server_config(server.build_parser().parse_args([
        "--responses-store-max-entries", "0", "--responses-store-max-bytes", "1MiB",
        "--responses-store-max-age", "60"]))
    assert (s.responses_store_max_entries, s.responses_store_max_bytes, s.responses_store_max_age) == (0, 2**20, 60.0)


def test_idle_connections_outlive_a_balancers():
    """The server keeps an idle keep-alive connection open longer than nginx keeps its idle
    upstream connections (``keepalive_timeout`` 60 s), so that the balancer closes them: a
    server closing one as the balancer reuses it loses a request."""
    default = server.server_config(server.build_parser().parse_args([]))
    assert default.timeout_keep_alive > 60
    assert server.uvicorn_config(object(), default).timeout_keep_alive == default.timeout_keep_alive
    cfg = server.server_config(server.build_parser().parse_args(["--timeout-keep-alive", "12.5"]))
    assert server.uvicorn_config(object(), cfg).timeout_keep_alive == 12.5


def test_new_flags_map_onto_config_fields():
    args = server.build_parser().parse_args(["--gpu-memory-utilization", "0.7", "--block-size", "32",
                                              "--tokenizer", "tok/dir", "--disable-log-requests",
                                              "--prefill-budget-while-decoding", "96", "--chat-template", "gemma3"])
    e = server.engine_config(args, model_config())
    assert (e.cache.gpu_memory_utilization, e.cache.block_size, e.tokenizer) == (0.7, 32, "tok/dir")
    assert e.chat_template == "gemma3"
    assert e.scheduler.prefill_budget_while_decoding == 96
    assert args.disable_log_requests
    d = server.engine_config(server.build_parser().parse_args([]), model_config())
    assert (d.dtype, d.cache.gpu_memory_utilization, d.cache.memory_utilization, d.cache.block_size) == (
        "auto", None, 0.9, 16)
    assert not server.build_parser().parse_args([]).disable_log_requests


def test_scheduling_policy_flags():
    args = server.build_parser().parse_args(["--scheduling-policy", "priority", "--priority-aging-s", "2.5"])
    sc = server.engine_config(args, model_config()).scheduler
    assert (sc.scheduling_policy, sc.priority_aging_s) == ("priority", 2.5)
    d = server.engine_config(server.build_parser().parse_args([]), model_config()).scheduler
    assert (d.scheduling_policy, d.priority_aging_s) == ("fcfs", None)


def help_blocks(text: str) -> dict[str, str]:
    """``--help`` output -> {flag: its help text (joined lines)}, and group titles as ``[title]``."""
    blocks, current = {}, None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = f"[{line[:-1]}]"
            blocks[current] = ""
        elif line.startswith("  -"):
            current = line.split()[0].rstrip(",")
            blocks[current] = line
        elif current is not None:
            blocks[current] += " " + line.strip()
    return blocks


def test_help_shows_every_default_once_and_an_advanced_group(capsys):
    with pytest.raises(SystemExit):
        server.build_parser().parse_args(["--help"])
    text = capsys.readouterr().out
    blocks = help_blocks(text)
    flags = [a.option_strings[0] for a in server.build_parser()._actions if a.option_strings[0] != "-h"]
    for flag in flags:
        assert blocks[flag].count("default:") == 1, (flag, blocks[flag])
    assert "(default: auto)" in blocks["--dtype"] and "(default: 16)" in blocks["--block-size"]
    assert "default: 0.9" in blocks["--gpu-memory-utilization"]
    groups = [k for k in blocks if k.startswith("[")]
    advanced = [g for g in groups if g.startswith("[advanced")]
    assert len(advanced) == 1
    in_advanced = [k for k in list(blocks)[list(blocks).index(advanced[0]) + 1:] if not k.startswith("[")]
    assert {"--scheduler", "--batch-timeout"} <= set(in_advanced)


def test_max_model_len_default_follows_the_model():
    args = server.build_parser().parse_args([])
    short = dataclasses.replace(model_config(), max_position_embeddings=2048)
    long = dataclasses.replace(model_config(), max_position_embeddings=8192)
    assert server.engine_config(args, short).scheduler.max_model_len == 2048
    assert server.engine_config(args, long).scheduler.max_model_len == 4096


@pytest.mark.parametrize("text,value", [("1073741824", 2**30), ("512MiB", 512 * 2**20), ("2G", 2 * 2**30),
                                        ("1.5k", 1536)])
def test_parse_bytes(text, value):
    assert server.parse_bytes(text) == value


def test_bad_flags_are_refused():
    with pytest.raises(argparse.ArgumentTypeError):
        server.parse_bytes("lots")
    with pytest.raises(SystemExit):
        server.build_parser().parse_args(["--truncate-prompt", "right"])


@pytest.mark.parametrize("flags", [["--max-num-seqs", "0"], ["--max-num-batched-tokens", "0"], ["--watermark", "1"],
                                   ["--num-blocks", "1"], ["--max-model-len", "1"], ["--max-queue-len", "-1"],
                                   ["--max-queue-len", "0"], ["--max-queue-wait", "0"], ["--api-key="],
                                   ["--served-model-name="], ["--max-model-len", "0"],
                                   ["--max-num-seqs", "64", "--max-num-batched-tokens", "32"],
                                   ["--kv-cache-memory", "0"], ["--request-timeout", "0"], ["--dtype", "float16"],
                                   ["--gpu-memory-utilization", "0"], ["--gpu-memory-utilization", "1.5"],
                                   ["--gpu-memory-utilization", "-0.2"], ["--block-size", "12"],
                                   ["--prefill-budget-while-decoding", "0"], ["--scheduling-policy", "lottery"],
                                   ["--priority-aging-s", "0"], ["--priority-aging-s", "-1"],
                                   ["--model", "m", "--model", "m"], ["--served-model-name", "a", "--served-model-name", "b"],
                                   ["--fallback-model", "m"], ["--degrade-ttft-slo", "1"],
                                   ["--fallback-model", "m", "--degrade-ttft-slo", "0"],
                                   ["--fallback-model", "m", "--degrade-ttft-slo", "1", "--num-processes", "2"],
                                   ["--chat-template", "no-such-template"], ["--chat-template", "gemma3", "--chat-template", "gemma3"],
                                   ["--timeout-keep-alive", "0"], ["--seed", "-1"],
                                   ["--model", "m", "--fallback-model", "m", "--degrade-ttft-slo", "1"]])
def test_flags_the_config_rejects_exit_2_before_loading(flags, capsys):
    parser = server.build_parser()
    with pytest.raises(SystemExit) as exc:
        server.check_flags(parser, parser.parse_args(flags))  # argparse's choices or the config's checks
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_several_models_each_get_a_name_and_a_share_of_the_kv_budget(caplog):
    import logging

    args = server.build_parser().parse_args([
        "--model", "m", "--served-model-name", "big", "--model", "m", "--served-model-name", "small",
        "--fallback-model", "small", "--degrade-ttft-slo", "2.5", "--kv-cache-memory", "4GiB", "--max-num-seqs", "3"])
    server.check_flags(server.build_parser(), args)
    assert server.server_config(args).served_model_name == "big"  # the default model
    caplog.set_level(logging.INFO, logger="jaxinfer.server")
    specs = server.kv_split(args)
    assert [(s.path, s.name, s.kv_cache_memory) for s in specs] == [("m", "big", 2 << 30), ("m", "small", 2 << 30)]
    assert "KV budget per model (per device): big 2.00 GiB, small 2.00 GiB" in caplog.text
    configs = [server.engine_config(server.model_args(args, s), model_config()) for s in specs]
    assert [c.cache.kv_cache_memory for c in configs] == [2 << 30, 2 << 30]
    assert all(c.model_path == "m" and c.scheduler.max_num_seqs == 3 for c in configs)  # other flags: each model
    other = server.build_parser().parse_args(["--fallback-model", "tiny", "--degrade-ttft-slo", "1"])
    assert [(s.path, s.name) for s in server.served_specs(other)] == [(server.DEFAULT_MODEL, server.DEFAULT_MODEL),
                                                                     ("tiny", "tiny")]  # loaded as well


def test_engine_failing_at_start_up_exits_1(tmp_path):
    """A server whose engine can never come up (here: a converted folder with nothing in it)
    exits 1, not unready forever."""
    import subprocess

    from api_helpers import free_port

    (tmp_path / "broken" / "params").mkdir(parents=True)
    proc = subprocess.run([sys.executable, str(REPO / "server.py"), "--model", str(tmp_path / "broken"),
                           "--port", str(free_port())], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "config.json" in proc.stderr  # it got as far as loading the folder
    # and its INFO lines came out in the server's own format (no earlier call stole the handler)
    assert " INFO jaxinfer.server: listening on http://" in proc.stderr, proc.stderr[-2000:]
    assert " INFO absl: " not in proc.stderr and "Unable to initialize backend" not in proc.stderr  # libraries' chatter


@pytest.mark.parametrize("model", ["smollm2", "{tmp}/missing.gguf", "{tmp}/nope"])
def test_an_unknown_model_exits_2_before_loading(tmp_path, model):
    """A misspelt name or a path that does not exist: one line naming it (a missing path
    says so), no usage text, no traceback, nothing loaded."""
    import subprocess

    from api_helpers import free_port

    model = model.format(tmp=tmp_path)
    proc = subprocess.run([sys.executable, str(REPO / "server.py"), "--model", model, "--port", str(free_port())],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: unknown model {model!r}" in proc.stderr
    assert ("no such file or folder" in proc.stderr) == (model != "smollm2")
    assert "usage:" not in proc.stderr and "Traceback" not in proc.stderr
    assert "loads in the background" not in proc.stderr


def test_a_port_in_use_exits_2_before_loading():
    import socket
    import subprocess
    import time

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, str(REPO / "server.py"), "--port", str(held.getsockname()[1])],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "cannot listen on" in proc.stderr and "usage:" not in proc.stderr
        assert "loads in the background" not in proc.stderr
        assert time.monotonic() - t0 < 60
    finally:
        held.close()


def test_several_models_are_built_one_at_a_time(monkeypatch):
    """Engine threads of several models must not load at once (transformers' first import is
    not thread-safe: two threads importing AutoTokenizer together failed)."""
    import threading
    import time

    from jaxinfer.engine import builder

    active, most = [0], [0]
    lock = threading.Lock()

    def load_model(config, load_format):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return model_config(), None, None, None

    monkeypatch.setattr(builder, "load_model", load_model)
    monkeypatch.setattr(builder, "build_engine", lambda config, **kw: config.model_path)
    args = server.build_parser().parse_args(["--model", "a", "--model", "b", "--model", "c", "--dtype", "float32"])
    built = []
    threads = [threading.Thread(target=lambda s=s: built.append(server.engine_builder(server.model_args(args, s))()))
               for s in server.served_specs(args)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(built) == ["a", "b", "c"] and most[0] == 1
