"""The ``loragate`` command: the outermost face of the registry.

One module per command group (``cli/registry.py``, ``cli/base.py``, ``cli/golden.py``,
``cli/validate.py``) parses its arguments, calls the registry or the tasks, and prints
text or stable ``--json``. Typed errors become exit codes once, here: 0 ok, 1 a gate or
the system failed, 2 bad input (nothing changed), 3 permission denied. Error lines go to
stderr as ``error: <code> [field]: <what>``.

Argparse, not typer or cyclopts: it is in the standard library, costs nothing to import
(read-only commands stay fast), and subparsers with parent parsers already give every
group its own module.

Building the parser imports only the standard library and the registry's stdlib-only
modules (``loragate.registry.errors``, ``loragate.registry.rules``, ``loragate.registry.intake.jsonio``). SQLAlchemy,
pydantic, the settings, the store, Prefect and the replicas' clients cost about a second
to import, so each is imported inside the handler that needs it (``open_registry``
imports ``Registry``; ``main`` imports ``Settings`` once the arguments parsed): ``--help``
and bad arguments never pay for them. ``tests/test_cli_startup.py`` keeps it so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
from collections.abc import Sequence

from loragate.cli import access, base, fleet, golden, maintenance, pipeline, registry, replicas, validate
from loragate.cli.output import EXIT_BAD_INPUT, EXIT_DENIED, EXIT_FAILED, common_options
from loragate.registry.errors import InvalidInput, LoragateError, PermissionDenied

COMMAND_GROUPS = (registry, base, golden, validate, fleet, replicas, pipeline, access, maintenance)
EXIT_TERMINATED = 128 + signal.SIGTERM


def exit_code_for(error: LoragateError) -> int:
    if isinstance(error, PermissionDenied):
        return EXIT_DENIED
    if isinstance(error, InvalidInput):
        return EXIT_BAD_INPUT
    return EXIT_FAILED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loragate",
        description="Registry and promotion gates for LoRA adapters served by vLLM.",
        parents=[common_options(top_level=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    common = common_options(top_level=False)
    for group in COMMAND_GROUPS:
        group.add_commands(sub, common)
    return parser


def _raise_on_sigterm(_signum: int, _frame: object) -> None:
    raise SystemExit(EXIT_TERMINATED)


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM raises SystemExit, so every ``finally`` and ``with`` cleans up on the way out
    (scratch files, unfinished uploads, open transactions); ``kill -9`` is the next write's job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with _sigterm_unwinds():
        try:
            from loragate.registry.settings import Settings  # pydantic-settings: only once a command runs

            args.settings = Settings(token=args.token) if args.token else Settings()
            return int(args.func(args))
        except LoragateError as e:
            if args.json:
                print(json.dumps({"error": e.as_dict()}, sort_keys=True))
            print(f"error: {e.one_line()}", file=sys.stderr)
            return exit_code_for(e)


if __name__ == "__main__":
    sys.exit(main())
