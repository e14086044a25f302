"""The layer rules (docs/reference/layout.md), checked on the source: who may import and touch whom."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the product's layers live in the one installed package; the kit, the benchmarks and the
# tests stay in the repository
PRODUCT = ("loragate.registry", "loragate.tasks", "loragate.flows", "loragate.cli", "loragate.local")
OUTSIDE_THE_WHEEL = {"kit", "bench", "tests"}
FORBIDDEN = {
    "loragate.registry": {"prefect", "loragate.tasks", "loragate.flows", "loragate.cli", "loragate.local"},
    "loragate.tasks": {"loragate.flows", "loragate.cli", "loragate.local"},
    "loragate.flows": {"loragate.cli", "loragate.local"},
    "loragate.cli": set(),
    "loragate.local": {"loragate.cli"},
    # the kit and the benchmarks never reach into the tests: what they share with them is the kit's
    "kit": {"loragate.cli", "bench", "tests"},
    "bench": {"loragate.cli", "tests"},
}
# the SQL store, its tables and its migrations are the registry's own: above it, only Registry
REGISTRY_PRIVATE_PACKAGE = "loragate.registry.db"
ABOVE_THE_REGISTRY = ("loragate.tasks", "loragate.flows", "loragate.cli")


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


def imported_layers(path: Path) -> set[str]:
    """``loragate.<layer>`` for the product's modules, the top-level name for anything else."""
    return {
        ".".join(m.split(".")[:2]) if m.startswith("loragate.") else m.split(".")[0] for m in imported_modules(path)
    }


def touched_attributes(path: Path) -> set[str]:
    return {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


def source_folders() -> list[Path]:
    """The repository's top-level folders holding Python (hidden ones, virtual environments
    among them, aside)."""
    return [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".") and any(d.rglob("*.py"))]


def sources(layer: str) -> list[Path]:
    return sorted((ROOT / layer.replace(".", "/")).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_nothing_above_it(layer):
    forbidden = FORBIDDEN[layer] | (OUTSIDE_THE_WHEEL if layer in PRODUCT else set())
    offenders = {str(p.relative_to(ROOT)): sorted(imported_layers(p) & forbidden) for p in sources(layer)}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_imports_the_cli_except_its_tests():
    users = [
        str(p.relative_to(ROOT))
        for layer in (*PRODUCT, "kit", "bench")
        if layer != "loragate.cli"
        for p in sources(layer)
        if "loragate.cli" in imported_layers(p)
    ]
    assert users == []


def test_the_repository_holds_no_python_package_but_loragate_and_its_kit():
    """What installs is ``loragate`` alone; beside it only what stays in the repository."""
    holders = sorted(d.name for d in source_folders())
    assert holders == ["bench", "infra", "kit", "loragate", "tests"]


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


MOVES = {"pointer_move", "rollback_move"}
# the switch of a registry with no replicas (loragate/registry/service/lifecycle.py)
SEAM = "NO_REPLICAS"
# what a move opened outside the product switches: the fleet's switch (the tests on real
# replicas), the named seam, or the recording switch of the tests of the move's one undo
# (tests/support/switches.py)
SWITCHES_OUTSIDE_THE_PRODUCT = {"FleetSwitch", SEAM, "RecordingSwitch"}


def names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
    }


def switches_of_moves(path: Path) -> list[str]:
    """What each move opened in ``path`` is given as ``switch=``: the seam by name, else the
    class the switch is made from (in the call, or where the file assigns the name it passes),
    else the expression. A move given no switch, or None, is left out: the registry refuses
    it at once (TypeError; tests/test_pointer_move.py)."""
    tree = ast.parse(path.read_text())
    made_from: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    made_from.setdefault(target.id, set()).add(node.value.func.id)
    kinds = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MOVES):
            continue
        for value in (k.value for k in node.keywords if k.arg == "switch"):
            if isinstance(value, ast.Constant) and value.value is None:
                continue
            if isinstance(value, ast.Name) and value.id != SEAM and value.id in made_from:
                kinds.extend(sorted(made_from[value.id]))
            elif isinstance(value, ast.Name):
                kinds.append(value.id)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                kinds.append(value.func.id)
            else:
                kinds.append(ast.unparse(value))
    return kinds


def test_only_the_fleet_switch_opens_a_pointer_move():
    """Replicas move with the pointer by construction: the registry's move takes the switch
    of its replicas and runs it, and in the product (``loragate/`` and ``kit/``) only the
    fleet switch (``loragate/tasks/fleet.py``) opens ``pointer_move`` or ``rollback_move``;
    nothing there names the no-replicas seam but its definition."""
    product = [p for layer in (*PRODUCT, "kit") for p in sources(layer)]
    openers = sorted(str(p.relative_to(ROOT)) for p in product if MOVES & touched_attributes(p))
    assert openers == ["loragate/tasks/fleet.py"]
    seam_users = sorted(str(p.relative_to(ROOT)) for p in product if SEAM in names_used(p))
    assert seam_users == ["loragate/registry/service/lifecycle.py"]


def test_outside_the_product_a_move_switches_the_fleet_the_named_seam_or_a_recording_switch():
    """A benchmark or test opening a move without the fleet's switch says so: it passes
    ``NO_REPLICAS`` (or, testing the move's undo, ``RecordingSwitch``), never a switch of its
    own making that quietly does nothing."""
    others = {
        str(p.relative_to(ROOT)): sorted(set(switches_of_moves(p)) - SWITCHES_OUTSIDE_THE_PRODUCT)
        for layer in ("bench", "tests")
        for p in sources(layer)
    }
    assert {k: v for k, v in others.items() if v} == {}


def test_only_the_prefect_wrappers_of_validation_import_prefect():
    """``loragate validate`` runs the plain functions: importing Prefect costs ~2.4 s."""
    importers = sorted(
        str(p.relative_to(ROOT)) for p in sources("loragate.tasks.validation") if "prefect" in imported_roots(p)
    )
    assert importers == ["loragate/tasks/validation/prefect_tasks.py"]


def test_the_rule_checker_sees_imports_and_attributes(tmp_path):
    """Guard against a checker that can never fail."""
    assert "prefect" in imported_roots(ROOT / "loragate" / "tasks" / "validation" / "prefect_tasks.py")
    offender = tmp_path / "offender.py"
    offender.write_text("from loragate.registry.db.store import SqlStore\nregistry.store.resolve('a', 'b')\n")
    assert "loragate.registry.db.store" in imported_modules(offender)
    assert {"store", "resolve"} <= touched_attributes(offender)
    quiet = tmp_path / "quiet_switch.py"
    quiet.write_text(
        "switch = Quiet()\n"
        "with registry.pointer_move(v, 'canary', switch=switch): pass\n"
        "with registry.rollback_move(n, switch=NO_REPLICAS): pass\n"
        "with registry.rollback_move(n, switch=lambda: None): pass\n"
    )
    assert switches_of_moves(quiet) == ["Quiet", "NO_REPLICAS", "lambda: None"]
    assert SEAM in names_used(quiet)


MAX_MODULE_LINES = 400


def test_no_module_is_longer_than_one_sitting():
    """One concern per module, small enough to read in one sitting (docs/reference/layout.md):
    every Python file of the repository, the kit, benchmarks and tests included."""
    long = {
        str(p.relative_to(ROOT)): n
        for folder in source_folders()
        for p in folder.rglob("*.py")
        if "build" not in p.relative_to(ROOT).parts
        if "migrations" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_registry_is_sub_packages_with_only_shared_modules_at_the_top():
    """A newcomer names the rooms: every concern lives in a sub-package of loragate/registry/."""
    top = sorted(p.name for p in (ROOT / "loragate" / "registry").glob("*.py"))
    assert top == [
        "__init__.py",
        "digests.py",
        "errors.py",
        "fan_out.py",
        "progress.py",
        "retrying.py",
        "settings.py",
    ]
    rooms = sorted(p.name for p in (ROOT / "loragate" / "registry").iterdir() if (p / "__init__.py").is_file())
    assert rooms == ["db", "intake", "records", "render", "rules", "service", "storage"]


INTAKE = "loragate.registry.intake"
# the rooms that take what comes in: the service registers bundles and pins bases with it
INTAKE_USERS = {"service"}


def test_inside_the_registry_only_the_service_imports_intake():
    """What comes in is checked by ``intake/`` and then kept: storage, rules, records, db and
    render never need it back. What they share with it lives where every room reaches it:
    content digests at the top of ``registry/``, the pinned base's record in ``records/``,
    the golden matcher in ``rules/``, a bundle's file names and safe opening in ``storage/``
    (docs/reference/layout.md)."""
    rooms = sorted(
        p.name
        for p in (ROOT / "loragate" / "registry").iterdir()
        if (p / "__init__.py").is_file() and p.name != "intake" and p.name not in INTAKE_USERS
    )
    assert rooms == ["db", "records", "render", "rules", "storage"]
    arrows = {}
    for room in rooms:
        for p in sources(f"loragate.registry.{room}"):
            into = {".".join(m.split(".")[:4]) for m in imported_modules(p) if m.split(".")[:3] == INTAKE.split(".")}
            if into:
                arrows[str(p.relative_to(ROOT))] = sorted(into)
    assert arrows == {}
