"""Crash-safe conversion and loading (issue 19): a conversion killed half-way or stopped by a
full disk never leaves a folder that loads; the next run cleans up, says so and converts
again, and the result generates what transformers generates from the source checkpoint; a
damaged checkpoint file is named in a `CheckpointError`, not an orbax traceback.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.weights import convert as convert_mod
from jaxinfer.weights.checkpoint import MANIFEST, CheckpointError, load_params, save_params
from jaxinfer.weights.convert import convert, is_complete
from test_convert import make_tiny_llama

REPO = Path(__file__).resolve().parents[1]
PROMPT = [5, 17, 99, 3, 250, 42]
N_TOKENS = 8


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "tiny-llama"
    make_tiny_llama(src)
    return src


@pytest.fixture(scope="module")
def oracle_tokens(tiny_src) -> list[int]:
    """transformers' greedy continuation of `PROMPT` from the source checkpoint."""
    import torch
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(str(tiny_src), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=N_TOKENS, min_new_tokens=N_TOKENS, do_sample=False)
    return out[0, len(PROMPT):].tolist()


def greedy_tokens(folder: Path) -> list[int]:
    llm = LLM(str(folder), dtype="float32", max_model_len=64, max_num_seqs=1, max_num_batched_tokens=16,
              num_blocks=16, warmup=False, use_tqdm=False)
    sp = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, ignore_eos=True)
    return llm.generate([PROMPT], sp, use_tqdm=False)[0].outputs[0].token_ids


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def kill_during_conversion(point: str, src: Path, out: Path) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "convert_killer.py"), point, str(src), str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("point", ["params", "publish"])
def test_sigkill_during_conversion_then_restart_gives_correct_weights(tmp_path, tiny_src, oracle_tokens, point,
                                                                      caplog):
    out = tmp_path / "weights" / "tiny"
    if point == "publish":  # --force over an earlier conversion, killed between moving it aside and renaming
        convert(tiny_src, out)
    kill_during_conversion(point, tiny_src, out)
    assert leftovers(out), "the killed process should have left its temporary folder"
    assert not is_complete(out) and not out.exists()  # nothing half-written is ever at the final name
    caplog.set_level(logging.WARNING, logger="jaxinfer")
    assert convert(tiny_src, out) == out  # the next start
    assert "interrupted" in caplog.text and str(out.parent) in caplog.text
    assert leftovers(out) == [] and is_complete(out)
    assert greedy_tokens(out) == oracle_tokens


@pytest.mark.parametrize("where", ["save_params", "_write_synced"])
def test_full_disk_leaves_no_loadable_folder(tmp_path, tiny_src, monkeypatch, where):
    out = tmp_path / "tiny"

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(convert_mod, where, full)
    with pytest.raises(OSError, match="No space left"):
        convert(tiny_src, out)
    assert not out.exists() and leftovers(out) == []
    monkeypatch.undo()
    assert convert(tiny_src, out) == out and is_complete(out)


def small_checkpoint(path: Path) -> dict:
    rs = np.random.RandomState(0)
    tree = {"embed": {"embedding": rs.randn(64, 32).astype(np.float32)}, "final_norm": {"scale": rs.randn(32)}}
    save_params(path, tree)
    return tree


def data_file(path: Path) -> Path:
    """The largest file of the checkpoint (the one holding the arrays)."""
    return max((f for f in path.rglob("*") if f.is_file() and f.name != MANIFEST), key=lambda f: f.stat().st_size)


def assert_clear(err: pytest.ExceptionInfo, names: Path) -> None:
    assert str(names) in str(err.value) and "--force" in str(err.value)
    e = err.value
    assert e.__cause__ is None and (e.__context__ is None or e.__suppress_context__)  # no orbax traceback chained


def test_truncated_checkpoint_file_is_named(tmp_path):
    path = tmp_path / "params"
    tree = small_checkpoint(path)
    np.testing.assert_array_equal(load_params(path)["embed"]["embedding"], tree["embed"]["embedding"])
    victim = data_file(path)
    os.truncate(victim, victim.stat().st_size // 2)
    with pytest.raises(CheckpointError, match="truncated") as err:
        load_params(path)
    assert err.value.path == victim
    assert_clear(err, victim)


def test_corrupt_checkpoint_file_is_named(tmp_path):
    """Orbax reads a flipped byte in an array without complaint; the manifest's hash does not."""
    path = tmp_path / "params"
    small_checkpoint(path)
    victim = data_file(path)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt") as err:
        load_params(path)
    assert err.value.path == victim
    assert_clear(err, victim)


def test_damaged_checkpoint_without_manifest_names_the_folder(tmp_path):
    """A checkpoint written before manifests existed: orbax's failure, in one line, naming the folder."""
    path = tmp_path / "params"
    small_checkpoint(path)
    (path / MANIFEST).unlink()
    metadata = path / "_METADATA"
    metadata.write_text(metadata.read_text()[: len(metadata.read_text()) // 2])
    with pytest.raises(CheckpointError, match="cannot read the parameter checkpoint") as err:
        load_params(path)
    assert err.value.path == path
    assert_clear(err, path)
    json.loads((path / "_CHECKPOINT_METADATA").read_text())  # only the damaged file was touched


def test_concurrent_first_uses_convert_once(tmp_path, monkeypatch):
    """A second process asking while the first converts waits on the lock, then finds the
    conversion complete and converts nothing (`jaxinfer.weights.catalog._ensure_converted`)."""
    import fcntl
    import threading

    from jaxinfer.weights import catalog as weights

    out, done, calls = tmp_path / "model", threading.Event(), []
    monkeypatch.setattr(weights._convert, "is_complete", lambda p: done.is_set())
    monkeypatch.setattr(weights._convert, "convert", lambda *a, **k: calls.append(a) or out)
    with open(tmp_path / ".model.lock", "w") as held:  # "the first process", mid-conversion
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=weights._ensure_converted,
                                  args=(lambda d: tmp_path / "x.gguf", out, tmp_path, None, False, "note"))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive()  # blocked on the lock
        done.set()  # the first process finished its conversion
    waiter.join(10.0)
    assert not waiter.is_alive() and calls == []
    done.clear()  # nothing converted yet, no one else converting: this process converts
    weights._ensure_converted(lambda d: tmp_path / "x.gguf", tmp_path / "other", tmp_path, None, False, "n")
    assert len(calls) == 1
