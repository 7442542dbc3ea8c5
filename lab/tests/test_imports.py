"""The lab's modules import without cycles (issue 32): keel_lab.servers and the modules
it uses do not import the suites package (whose __init__ imports every suite, which
import keel_lab.servers), and no suite module imports another suite module."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SUITES = Path(__file__).resolve().parents[1] / "keel_lab" / "suites"


@pytest.mark.parametrize("module", ["keel_lab.servers", "keel_lab.clients", "keel_lab.errors",
                                    "keel_lab.measure", "keel_lab.procfs", "keel_lab.procs"])
def test_server_side_modules_do_not_import_the_suites(module):
    code = (f"import sys, {module}\n"
            "bad = sorted(m for m in sys.modules if m.startswith('keel_lab.suites'))\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_suite_modules_import_only_base_from_the_suites():
    for path in sorted(SUITES.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                assert node.module == "base", f"{path.name} imports .{node.module}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("keel_lab.suites."), \
                    f"{path.name} imports {node.module}"


def test_suite_error_is_one_class():
    from keel_lab.errors import SuiteError
    from keel_lab.suites.base import SuiteError as FromBase
    assert FromBase is SuiteError
