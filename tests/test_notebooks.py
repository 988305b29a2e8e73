"""notebooks/headline.ipynb executed headless (nbclient, the repo's Python as the kernel):
once on the newest committed ``compare.json`` and once on a results file in the newer format
(a ``llamacpp`` system, stored ratios). Any cell error fails the test.

notebooks/quickstart.ipynb is not executed here: it loads and compiles the real model, well
over a minute on a 2-core CPU.
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
NOTEBOOK = ROOT / "notebooks" / "headline.ipynb"


def execute(path: Path = NOTEBOOK):
    """Run every cell in ``notebooks/`` (as Jupyter would); returns the executed notebook.
    Raises nbclient's CellExecutionError on the first failing cell."""
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def newest_committed() -> Path:
    found = sorted(ROOT.glob("benchmarks/results/*/compare.json"),
                   key=lambda p: (json.loads(p.read_text())["metadata"]["date"], p.parent.name))
    if not found:
        pytest.skip("no committed compare.json")
    return found[-1]


def test_headline_notebook_on_committed_results(monkeypatch):
    monkeypatch.delenv("JAXINFER_COMPARE_JSON", raising=False)
    committed = newest_committed()
    nb = execute()
    text = outputs_text(nb)
    assert committed.parent.name in text  # it read the newest results folder
    first_scen, systems = next(iter(json.loads(committed.read_text())["scenarios"].items()))
    name, e = next(iter(systems.items()))
    assert f"| {first_scen} | {name} | {e['concurrency']} | {e['counts']['ok']}/{e['counts']['total']} " \
           f"| {e['output_throughput_tok_s']:.1f} |" in text
    assert sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) >= 1


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
