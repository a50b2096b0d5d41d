"""The package's shape (issue 28): layers checked by import-linter's contracts (pyproject.toml), no import circle
between modules (function-level imports count), no module over 450 lines, and no runtime, analysis, telemetry, env
or core module that names an agent."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "rlbalance"


def test_import_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if exe is None:
        pytest.fail("lint-imports is missing: pip install -e '.[test]' installs import-linter")
    r = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_no_import_circle():
    import grimp

    graph = grimp.build_graph("rlbalance")
    modules = sorted(graph.modules)
    # a circle: two modules each reachable from the other (packages' __init__ re-exports count as their modules)
    circles = [(a, b) for a in modules for b in graph.find_modules_directly_imported_by(a)
               if a != b and graph.chain_exists(importer=b, imported=a)]
    assert not circles, circles[:5]


def test_no_module_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 450}
    assert not long, long


def test_only_agents_config_cli_and_bench_name_an_agent():
    allowed = ("agents", "config", "cli", "bench")
    named = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG)
        if rel.parts[0] in allowed:
            continue
        hits = [i + 1 for i, line in enumerate(p.read_text().splitlines()) if re.search(r"\b(r2d2|vtrace)\b", line, re.I)]
        if hits:
            named[str(rel)] = hits
    assert not named, named


def test_no_runtime_module_names_an_agents_per_step_fields():
    """The runtime moves what an agent declares (Agent.step_record, Agent.acting_values) and names none of it."""
    named = {}
    for p in (PKG / "runtime").rglob("*.py"):
        hits = [i + 1 for i, line in enumerate(p.read_text().splitlines())
                if re.search(r"\b(logits|explore|exploration|epsilons?)\b", line, re.I)]
        if hits:
            named[str(p.relative_to(PKG))] = hits
    assert not named, named
