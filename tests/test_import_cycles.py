"""The repository's import graph has no cycle: a module never needs, however indirectly, a
module that needs it -- deferred imports inside functions counted, since they run, and
imports under ``if TYPE_CHECKING:`` too: a type that needs its user is a cycle of concepts
the runtime merely does not see.

Imports are absolute (ruff's TID252 refuses a relative one), read by ``test_layers``'
parser. An edge goes to the module an import names (``from a.b import c`` to ``a.b.c`` when
that is a module, else to ``a.b``), not to the packages above it that Python initialises on
the way.
"""

from __future__ import annotations

from pathlib import Path

from tests.test_layers import imported_modules

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("loragate", "kit", "bench", "tests")


def modules_under(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    found = {}
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if "build" in parts:
                continue
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {}
    for module, path in modules.items():
        names = imported_modules(path)
        # ``from a.b import c``: the module a.b.c when there is one, else a.b itself
        targets = {n for n in names if n in modules}
        targets -= {n.rpartition(".")[0] for n in targets if n.rpartition(".")[0] in targets and n in names}
        graph[module] = targets - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph(modules_under(ROOT, FOLDERS))) == []


def test_the_cycle_finder_sees_a_cycle_through_a_deferred_import(tmp_path):
    """Guard against a checker that can never fail: a -> b at import, b -> c -> a inside
    functions; ``typed`` -> ``d`` only for type checking, and ``d`` -> ``typed``."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("def g():\n    import pkg.a\n")
    (package / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import x\n")
    (package / "d.py").write_text("from pkg import typed\n")
    (package / "e.py").write_text("from pkg.d import typed\n")
    graph = import_graph(modules_under(tmp_path, ("pkg",)))
    assert sorted(cycles(graph)) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.typed"]]
    assert graph["pkg.typed"] == {"pkg.d"}
    assert graph["pkg.d"] == {"pkg.typed"} and graph["pkg.e"] == {"pkg.d"}
