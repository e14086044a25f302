"""The layer rules of DESIGN.md, checked on the source: who may import whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("registry", "tasks", "flows", "cli", "infra", "tests", "bench")
FORBIDDEN = {
    "registry": {"prefect", "tasks", "flows", "cli"},
    "tasks": {"flows", "cli"},
    "flows": {"cli"},
    "infra": {"cli"},
    "bench": {"cli"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def sources(layer: str):
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    offenders = {
        str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN[layer]) for p in sources(layer)
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_imports_the_cli_except_its_tests():
    users = [str(p.relative_to(ROOT)) for layer in LAYERS if layer not in ("cli", "tests") for p in sources(layer) if "cli" in imported_roots(p)]
    assert users == []


def test_the_rule_checker_sees_imports():
    """Guard against a checker that can never fail: tasks/validation.py imports prefect."""
    assert "prefect" in imported_roots(ROOT / "tasks" / "validation.py")
