"""The code the registry benchmark (``bench.registry``) measures: this tree's, or with
``LORAGATE_BENCH_CODE`` an earlier revision's checkout (``--against``:
``bench/registry_against.py``), driven by this same harness so both sides are measured the
same way.

The harness is this tree's ``bench`` package. The code under test is reached only through
``code_module``, by name, never by an import statement: it puts the code's root first on
``sys.path`` before that code's first import, so no import order lets this tree (or its
editable install) answer for another revision, and it checks where each module came from.
The model kit follows the same path: the code's own ``kit`` where it has one, this tree's
otherwise. A revision from before the product moved into the ``loragate`` package keeps its
registry at the top level (``registry.service``, not ``loragate.registry.service``).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("LORAGATE_BENCH_CODE", ROOT)).resolve()
# the registry package on that side
REGISTRY = "loragate.registry" if (CODE / "loragate" / "registry").is_dir() else "registry"

# for the model kit's tokenizers, before anything loads them (the same in every run, either side)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _missing_on_this_side(error: ModuleNotFoundError, module: str) -> bool:
    """The module (or a package above it, within the registry) is not there: an earlier layout."""
    missing = error.name or ""
    return missing.startswith(REGISTRY) and (module == missing or module.startswith(missing + "."))


def code_module(*names: str) -> ModuleType:
    """``<registry package>.<name>`` of the code under test, the first of ``names`` that side
    has (a later name is where an earlier revision kept the same thing)."""
    if sys.path[0] != str(CODE):
        sys.path.insert(0, str(CODE))
    for name in names:
        module_name = f"{REGISTRY}.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if _missing_on_this_side(e, module_name):
                continue
            raise
        origin = Path(module.__file__ or "").resolve()
        if not origin.is_relative_to(CODE):
            raise ImportError(f"{module_name} came from {origin}, not from the code under test in {CODE}")
        return module
    raise ImportError(f"the code in {CODE} has none of {', '.join(f'{REGISTRY}.{n}' for n in names)}")
