"""Issue 18 point 5: ``securefed --help`` and ``securefed flower --help`` answer without
importing Flower or torch (importing them took ~21 s on a loaded machine). Checked in a fresh
interpreter by what it imported, not by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Modules a help text must not wait for: Flower (and its Ray), torch and what imports it.
HEAVY = ("flwr", "ray", "torch", "opacus", "pandas", "scipy")

PROBE = """
import json, sys
argv = json.loads(sys.argv[1])
if argv is None:
    import securefed.cli
else:
    from typer.testing import CliRunner
    from securefed.cli import app
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output, res.output
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def _heavy_imported(argv: list[str] | None) -> list[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_cli_imports_neither_flower_nor_torch():
    assert _heavy_imported(None) == []


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["train", "--help"], ["flower", "--help"], ["flower", "local", "--help"]],
)
def test_help_texts_import_neither_flower_nor_torch(argv):
    assert _heavy_imported(argv) == []


def test_the_public_api_is_still_there_when_first_used():
    """``securefed`` imports its API on first use (PEP 562): same objects, clear errors."""
    import securefed
    import securefed.training

    assert securefed.train is securefed.training.train
    from securefed import PrivacyConfig, TrainConfig, TrainResult

    assert TrainResult is securefed.training.TrainResult
    assert TrainConfig().privacy == PrivacyConfig()
    assert set(securefed.__all__) <= set(dir(securefed))
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        securefed.trian  # noqa: B018


def test_submodules_are_reachable_after_a_plain_import():
    """As when ``securefed/__init__.py`` imported everything: ``securefed.runs.load_state``
    (the README's way to read ``model.pt``) works after ``import securefed`` alone."""
    code = (
        "import securefed; print(securefed.runs.load_state.__name__, "
        "securefed.evaluation.__name__, hasattr(securefed, 'no_such_module'))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["load_state", "securefed.evaluation", "False"]


def test_the_packages_are_marked_typed():
    """PEP 561: without ``py.typed`` mypy skips securefed's annotations in a user's code
    (``import-untyped``; found by a library walkthrough) and checks none of their calls."""
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in ("securefed", "attacks", "protocols"):
        assert (ROOT / package / "py.typed").is_file(), package
        assert "py.typed" in data["package-data"][package], package
