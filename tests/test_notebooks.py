"""Every notebook under notebooks/ executed headless, top to bottom, as Jupyter would
(nbclient; the ``python3`` kernel spec, whose ``python`` jupyter_client replaces with
``sys.executable``: the project venv's Python that runs pytest). Any cell error fails the
test, and the notebooks assert their own claims (equal TP outputs, shared prefix blocks...).

headline.ipynb runs once on the newest committed ``compare.json`` and once on a results file
in the newer format (a ``llamacpp`` system, stored ratios). kv_cache_and_batching.ipynb and
sharding.ipynb use a tiny random model; quickstart.ipynb loads the real SmolLM2, starts the
HTTP server and compiles (cold: minutes; with the persistent compilation cache: ~40 s).

Notebooks are committed without outputs; each first cell says how to start Jupyter.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NOTEBOOK = NOTEBOOKS / "headline.ipynb"
JUPYTER_START = ".venv/bin/python -m jupyter lab notebooks/"


def execute(path: Path = NOTEBOOK):
    """Run every cell of ``path`` with ``notebooks/`` as the working directory (as Jupyter
    would); returns the executed notebook. Raises nbclient's CellExecutionError on the first
    failing cell."""
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def num_plots(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def newest_committed() -> Path:
    """The notebook's rule, restated: the newest compare.json (any depth) with two or more
    systems on the ``fixed`` scenario."""
    runs = [(json.loads(p.read_text()), p) for p in ROOT.glob("benchmarks/results/**/compare.json")]
    found = sorted(((r["metadata"]["date"], str(p)), p) for r, p in runs if len(r["scenarios"].get("fixed", {})) >= 2)
    if not found:
        pytest.skip("no committed compare.json comparing systems on the fixed scenario")
    return found[-1][1]


def test_headline_notebook_on_committed_results(monkeypatch):
    monkeypatch.delenv("JAXINFER_COMPARE_JSON", raising=False)
    committed = newest_committed()
    nb = execute()
    text = outputs_text(nb)
    assert str(committed.parent.relative_to(ROOT / "benchmarks" / "results")) in text  # it read the newest headline run
    first_scen, systems = next(iter(json.loads(committed.read_text())["scenarios"].items()))
    name, e = next(iter(systems.items()))
    assert f"| {first_scen} | {name} | {e['concurrency']} | {e['counts']['ok']}/{e['counts']['total']} " \
           f"| {e['output_throughput_tok_s']:.1f} |" in text
    assert num_plots(nb) >= 1


def test_headline_notebook_on_results_with_llamacpp(tmp_path, monkeypatch):
    """A newer-format file: the committed results plus a llamacpp system and the stored
    ratios / acceptance that compare.py writes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import compare
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    committed = newest_committed()
    result = json.loads(committed.read_text())
    for per in result["scenarios"].values():
        jx = per.get("jaxinfer")
        if jx is not None:
            per["llamacpp"] = {**jx, "output_throughput_tok_s": jx["output_throughput_tok_s"] / 2,
                               "ttft_ms": {k: v * 4 for k, v in jx["ttft_ms"].items()}}
    result["ratios"] = compare.ratios(result["scenarios"])
    result["acceptance"] = compare.acceptance(result["scenarios"], result["ratios"])
    out = tmp_path / "results" / "2099-01-01-test"
    out.mkdir(parents=True)
    (out / "compare.json").write_text(json.dumps(result))
    if (committed.parent / "runs").is_dir():
        shutil.copytree(committed.parent / "runs", out / "runs")
    monkeypatch.setenv("JAXINFER_COMPARE_JSON", str(out / "compare.json"))
    text = outputs_text(execute())
    assert "2099-01-01-test" in text
    assert "| jaxinfer/llamacpp | 2.00 | 0.25 |" in text  # half the throughput, 4x the TTFT
    assert ">= 1.5 | 2 | pass |" in text  # the 32-client throughput line


EXECUTED = {
    # name -> text the executed notebook must print, and how many plots it must draw
    "kv_cache_and_batching.ipynb": (["preemptions, watermark", "came from the cache"], 3),
    "sharding.ipynb": (["equal to TP 1: True", "llama-3-70b | 8 |"], 1),
    "quickstart.ipynb": (["server ready on port", "chunks:", "server exit status: 0"], 0),
}


def all_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda p: p.name)
def test_notebook_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs; clear them before committing"


@pytest.mark.parametrize("path", all_notebooks(), ids=lambda p: p.name)
def test_notebook_first_cell_says_how_to_start_jupyter(path):
    first = nbformat.read(path, as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    assert JUPYTER_START in first.source and "pip install jupyterlab" in first.source


def test_every_notebook_is_executed_here():
    """A new notebook must get an execution test below (or be headline.ipynb, run above)."""
    assert {p.name for p in all_notebooks()} == {"headline.ipynb", *EXECUTED}


@pytest.mark.parametrize("name", [
    "kv_cache_and_batching.ipynb", "sharding.ipynb",
    pytest.param("quickstart.ipynb", marks=[pytest.mark.real_model, pytest.mark.slow])])
def test_notebook_runs_top_to_bottom(name):
    nb = execute(NOTEBOOKS / name)
    text = outputs_text(nb)
    expected, plots = EXECUTED[name]
    for needle in expected:
        assert needle in text, needle
    assert num_plots(nb) == plots
