"""Public functions of ``registry/`` that raise typed errors say which, in their docstring."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_EXCEPTIONS = {name for name in dir(builtins) if name.endswith(("Error", "Exception"))}


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc
    if exc is None:
        return None  # a bare re-raise
    if isinstance(exc, ast.Call):
        exc = exc.func
    return exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None


def _own_raises(func: ast.FunctionDef) -> set[str]:
    """What the function raises itself (not its nested helpers), builtins and internals aside."""
    names: set[str] = set()
    stack: list[ast.AST] = list(func.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Raise):
            name = _raised_name(node)
            if name and name not in BUILTIN_EXCEPTIONS and name != "_NothingToDo":
                names.add(name)
        stack.extend(ast.iter_child_nodes(node))
    return names


def undocumented_raisers(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    where = path.relative_to(ROOT) if ROOT in path.parents else path.name
    found = []
    scopes: list[tuple[str, ast.AST]] = [("", tree)]
    while scopes:
        prefix, scope = scopes.pop()
        for node in ast.iter_child_nodes(scope):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                scopes.append((f"{node.name}.", node))
            elif (
                isinstance(node, ast.FunctionDef)
                and (not node.name.startswith("_") or node.name == "__init__")
                and _own_raises(node)
                and "Raises" not in (ast.get_docstring(node) or "")
            ):
                found.append(f"{where}:{prefix}{node.name}")
    return found


def test_public_registry_functions_that_raise_typed_errors_document_them():
    offenders = [f for p in sorted((ROOT / "loragate" / "registry").rglob("*.py")) for f in undocumented_raisers(p)]
    assert offenders == []


SAMPLE = """
def loud(x):
    "No word on errors."
    raise InvalidInput("bad")


def quiet(x):
    "Raises: InvalidInput when bad."
    raise InvalidInput("bad")


def plain(x):
    raise ValueError("not typed")
"""


def test_the_docstring_checker_finds_an_undocumented_raise(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE)
    assert undocumented_raisers(sample) == ["sample.py:loud"]
