"""The layer rules (docs/reference/layout.md), checked on the source: who may import and touch whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("registry", "tasks", "flows", "cli", "infra", "tests", "bench")
FORBIDDEN = {
    "registry": {"prefect", "tasks", "flows", "cli", "infra"},
    "tasks": {"flows", "cli", "infra"},
    "flows": {"cli", "infra"},
    "infra": {"cli"},
    "bench": {"cli"},
}
# the SQL store, its tables and its migrations are the registry's own: above it, only Registry
REGISTRY_PRIVATE_PACKAGE = "registry.db"
ABOVE_THE_REGISTRY = ("tasks", "flows", "cli")


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
            modules.update(f"{node.module}.{a.name}" for a in node.names)
    return modules


def imported_roots(path: Path) -> set[str]:
    return {m.split(".")[0] for m in imported_modules(path)}


def touched_attributes(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


def sources(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    offenders = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN[layer]) for p in sources(layer)}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_imports_the_cli_except_its_tests():
    users = [
        str(p.relative_to(ROOT))
        for layer in LAYERS
        if layer not in ("cli", "tests")
        for p in sources(layer)
        if "cli" in imported_roots(p)
    ]
    assert users == []


@pytest.mark.parametrize("layer", ABOVE_THE_REGISTRY)
def test_above_the_registry_only_the_registry_api_reaches_the_store(layer):
    offenders = {}
    for p in sources(layer):
        private = sorted(
            m
            for m in imported_modules(p)
            if m == REGISTRY_PRIVATE_PACKAGE or m.startswith(REGISTRY_PRIVATE_PACKAGE + ".")
        )
        attributes = sorted(touched_attributes(p) & {"store", "_store", "_artifacts", "engine"})
        if private or attributes:
            offenders[str(p.relative_to(ROOT))] = private + attributes
    assert offenders == {}


def test_only_the_prefect_wrappers_of_validation_import_prefect():
    """``loragate validate`` runs the plain functions: importing Prefect costs ~2.4 s."""
    importers = sorted(str(p.relative_to(ROOT)) for p in sources("tasks/validation") if "prefect" in imported_roots(p))
    assert importers == ["tasks/validation/prefect_tasks.py"]


def test_the_rule_checker_sees_imports_and_attributes(tmp_path):
    """Guard against a checker that can never fail."""
    assert "prefect" in imported_roots(ROOT / "tasks" / "validation" / "prefect_tasks.py")
    offender = tmp_path / "offender.py"
    offender.write_text("from registry.db.store import SqlStore\nregistry.store.resolve('a', 'b')\n")
    assert "registry.db.store" in imported_modules(offender)
    assert {"store", "resolve"} <= touched_attributes(offender)


MAX_MODULE_LINES = 450


def test_no_module_above_infra_is_longer_than_one_sitting():
    """One concern per module, small enough to read in one sitting (docs/reference/layout.md)."""
    long = {
        str(p.relative_to(ROOT)): n
        for layer in ("registry", "tasks", "flows", "cli")
        for p in sources(layer)
        if "migrations" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_registry_is_sub_packages_with_only_shared_modules_at_the_top():
    """A newcomer names the rooms: every concern lives in a sub-package of registry/."""
    top = sorted(p.name for p in (ROOT / "registry").glob("*.py"))
    assert top == ["__init__.py", "errors.py", "retrying.py", "settings.py"]
    rooms = sorted(p.name for p in (ROOT / "registry").iterdir() if (p / "__init__.py").is_file())
    assert rooms == ["db", "intake", "records", "render", "rules", "service", "storage"]
