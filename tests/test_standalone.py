"""The repository stands alone: everything its tests and docs need lives inside it.

References: a fresh ``git clone`` of this checkout's committed HEAD into an empty temporary
folder (nothing beside it), where pytest must collect every test module without error; and
the tracked files themselves, searched for paths that leave the repository and, in the
user docs, for wording that only makes sense to the people who built it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Paths that leave the repository: the sibling folder the reference data once lived in, and
# absolute paths of the machines it was built on. Split so this file does not match itself.
OUTSIDE_PATHS = re.compile("|".join([
    r"\.\./" + "shared",
    r"(?<![\w./-])" + "shared/" + r"(oracle|cases|facts\.md|design\.md|hooks|peers)",
    r"\b(REPO|ROOT)\.parent\b",
    r"/" + r"work/",
]))
# "session" alone is a user concept (X-Session-Id routing); the team's own work sessions are not
INTERNAL_WORDING = re.compile(r"\b(" + "brief" + r"|(this|previous|next|last|later|earlier|a work) " + "session"
                              + r"s?|" + "lent" + r")\b", re.IGNORECASE)
CODE_AND_DOCS = ("jaxinfer/", "tests/", "benchmarks/", "docs/", "notebooks/", "configs/")
USER_DOCS = ("README.md", "weights/README.md", "jaxinfer/kernels/pallas/README.md", "tests/data/README.md")


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def tracked(prefixes: tuple[str, ...], suffixes: tuple[str, ...]) -> list[str]:
    """Tracked files (working tree) under ``prefixes`` (or equal to one) ending in ``suffixes``."""
    return [f for f in git("ls-files").splitlines()
            if f.startswith(prefixes) or f in prefixes
            if f.endswith(suffixes) and not f.startswith("benchmarks/results/")]


@pytest.fixture(scope="module")
def lone_clone(tmp_path_factory) -> Path:
    """This checkout's committed HEAD cloned into ``<tmp>/lone/jaxinfer``, alone in its folder."""
    head = git("rev-parse", "HEAD").strip()
    clone = tmp_path_factory.mktemp("lone") / "jaxinfer"
    git("clone", "-q", "--no-checkout", str(REPO), str(clone))
    git("checkout", "-q", "--detach", head, cwd=clone)
    assert [p.name for p in clone.parent.iterdir()] == ["jaxinfer"]
    return clone


def clone_env() -> dict[str, str]:
    """The current environment without PYTHONPATH, so the clone imports its own code."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_lone_clone_imports_its_own_code(lone_clone):
    r = subprocess.run([sys.executable, "-c", "import jaxinfer; print(jaxinfer.__file__)"], cwd=lone_clone,
                       env=clone_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).resolve().is_relative_to(lone_clone.resolve())


def test_lone_clone_collects_every_test(lone_clone):
    """``pytest --collect-only`` in the clone: exit 0, no collection error, every test module seen."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                       cwd=lone_clone, env=clone_env(), capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert not re.search(r"\berrors?\b", out.splitlines()[-1]), out[-4000:]
    modules = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    expected = {f for f in git("ls-files", "tests", cwd=lone_clone).splitlines() if Path(f).name.startswith("test_")}
    assert modules == expected


def test_no_path_outside_the_repository():
    me = Path(__file__).relative_to(REPO).as_posix()
    files = tracked(CODE_AND_DOCS + ("README.md", "weights/README.md", "server.py", "Makefile"),
                    (".py", ".sh", ".md", ".ipynb", ".json", "Makefile"))
    assert "tests/conftest.py" in files and "README.md" in files
    hits = [f"{f}:{n}: {line.strip()}" for f in files if f != me
            for n, line in enumerate((REPO / f).read_text(errors="replace").splitlines(), 1)
            if OUTSIDE_PATHS.search(line)]
    assert not hits, "\n".join(hits)


def test_user_docs_have_no_internal_wording():
    files = tracked(USER_DOCS + ("docs/", "notebooks/"), (".md", ".ipynb"))
    assert "README.md" in files and "docs/api.md" in files
    hits = [f"{f}:{n}: {line.strip()}" for f in files
            for n, line in enumerate((REPO / f).read_text().splitlines(), 1)
            if INTERNAL_WORDING.search(line) or OUTSIDE_PATHS.search(line)]
    assert not hits, "\n".join(hits)


def test_script_folders_shadow_no_installed_module():
    """Tests put ``benchmarks/`` first on ``sys.path`` (to import its scripts), so a script named
    like an installed package hides that package from every library in the process: a
    ``benchmarks/kernels.py`` once broke transformers, which imports the ``kernels`` package
    where it is installed. No script under a folder the tests add to the path may share its
    name with a module that the environment's own search path finds."""
    import importlib.machinery

    folders = [REPO / "benchmarks", REPO / "tests"]
    outside = [p for p in sys.path if p and Path(p).resolve() not in {f.resolve() for f in folders}
               and Path(p).resolve() != REPO]
    clashes = [f"{f.relative_to(REPO)}/{s.name}" for f in folders for s in sorted(f.glob("*.py"))
               if importlib.machinery.PathFinder.find_spec(s.stem, outside) is not None
               or s.stem in sys.builtin_module_names]
    assert not clashes, f"rename these scripts; installed modules of the same name exist: {clashes}"
