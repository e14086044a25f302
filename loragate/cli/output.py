"""What every command shares: the common options, progress lines, text or ``--json`` output.

Standard library only at import time: every command group imports this module while the
parser is built, so ``Registry`` (SQLAlchemy, pydantic, the whole store) is imported by
``open_registry`` when a command runs, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loragate.registry.progress import Progress
    from loragate.registry.service import Registry

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_DENIED = 3
# ``loragate init`` leaves the first admin token here, under LORAGATE_HOME
ADMIN_TOKEN_FILE = "admin.token"


def common_options(*, top_level: bool) -> argparse.ArgumentParser:
    """``--json`` and ``--progress``, accepted before or after the subcommand.

    On the subcommands their default is SUPPRESS, so a subcommand that does not repeat an
    option keeps what the top level parsed instead of resetting it.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top_level else argparse.SUPPRESS,
        help="machine-readable output (stable: docs/reference/json.md)",
    )
    parser.add_argument(
        "--token",
        default=None if top_level else argparse.SUPPRESS,
        help="API token for a command that changes something (default: $LORAGATE_TOKEN); "
        "prefer the variable: arguments show in the process list",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None if top_level else argparse.SUPPRESS,
        help="progress lines on stderr (default: when stderr is a terminal)",
    )
    return parser


def progress_printer(args: argparse.Namespace) -> Progress:
    from loragate.registry.progress import quiet

    show = args.progress or (
        args.progress is None and (sys.stderr.isatty() or os.environ.get("LORAGATE_PROGRESS") == "1")
    )
    if not show:
        return quiet
    return lambda msg: print(f"… {msg}", file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, payload: Any, text: str | Callable[[], str]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    else:
        print(text() if callable(text) else text)


def open_registry(args: argparse.Namespace, *, check_schema: bool = True) -> Registry:
    from loragate.registry.service import Registry

    return Registry.open(args.settings, check_schema=check_schema)


def write_secret_file(path: Path, secret: str) -> Path:
    """Write ``secret`` to ``path`` readable by its owner only, from the first byte (the
    file is created 0600, not chmod-ed after), replacing an older one atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise
    return path.absolute()
