"""ruff and mypy stay clean on the lab (configured in lab/pyproject.toml). Skipped where
they are not installed (pip install -e 'lab[test]' installs them)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    """The tool next to this Python (the venv's), else on PATH; skip if neither."""
    here = Path(sys.executable).parent / name
    exe = str(here) if here.exists() else shutil.which(name)
    if not exe:
        pytest.skip(f"{name} is not installed (pip install -e 'lab[test]')")
    return exe


def test_ruff_is_clean():
    r = subprocess.run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise",
                        str(LAB)], cwd=LAB, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"ruff check lab:\n{r.stdout}{r.stderr}"


def test_mypy_is_clean():
    r = subprocess.run([_tool("mypy"), "--config-file", str(LAB / "pyproject.toml"),
                        "--no-incremental", "--cache-dir", "/dev/null", str(LAB / "keel_lab")],
                       cwd=LAB, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"mypy lab/keel_lab:\n{r.stdout}{r.stderr}"
