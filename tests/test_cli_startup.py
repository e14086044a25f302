"""``loragate --help``, every subcommand's ``--help`` and a mistyped command start light.

Building the parser and refusing or explaining arguments imports the standard library and
the registry's stdlib-only modules, never the store, its settings or the clients (about a
second on a quiet machine): each command imports those when it runs (cli/main.py). A fresh
process walks every subparser, nested ones included (``canary share``), asks each for its
``--help`` through ``loragate.cli.main.main``, then lists what was imported. No timing is asserted:
what is imported is the cause, and it does not vary with the machine's load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# each module the parser must not import, and what it would cost the command
HEAVY = {
    "sqlalchemy": "the SQL store's engine",
    "pydantic": "the records and the manifest",
    "pydantic_settings": "Settings",
    "prefect": "the pipeline's orchestrator (~2 s)",
    "httpx": "the replicas' and Prefect's HTTP client",
    "torch": "the model kit and validation",
    "cryptography": "signing keys",
    "loragate.registry.service": "Registry, and with it the whole store",
    "loragate.registry.settings": "Settings, read once a command runs",
    "loragate.registry.db": "the SQL store",
}
# refused by argparse (exit 2) before any command runs
BAD_ARGUMENTS = (
    ["no-such-command"],
    ["rollback"],
    ["canary", "share", "acme/tiny-llama/support"],
    ["list", "--no-such-option"],
)

PROBE = """
import argparse, contextlib, io, json, sys
{preamble}
from loragate.cli.main import build_parser, main

def commands(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, (*path, name))

def run(argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return main(argv)
        except SystemExit as e:
            return e.code

paths = list(commands(build_parser()))
helps = {{" ".join(p): run([*p, "--help"]) for p in paths}}
bad = {{" ".join(a): run(a) for a in json.loads(sys.argv[1])}}
print(json.dumps({{"help": helps, "bad": bad, "modules": sorted(sys.modules)}}))
"""


def probe(preamble: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(preamble=preamble), json.dumps(BAD_ARGUMENTS)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def imported(result: dict, module: str) -> list[str]:
    return [m for m in result["modules"] if m == module or m.startswith(module + ".")]


@pytest.fixture(scope="module")
def startup() -> dict:
    return probe()


def test_the_probe_asks_every_command_for_its_help(startup):
    helps = startup["help"]
    assert {"", "rollback", "list", "canary", "canary share", "canary feedback", "token create"} <= set(helps)
    assert len(helps) > 40
    assert set(helps.values()) == {0}  # each printed its help and exited 0


def test_bad_arguments_are_refused_by_the_parser(startup):
    assert startup["bad"] == {" ".join(a): 2 for a in BAD_ARGUMENTS}


@pytest.mark.parametrize("module", sorted(HEAVY))
def test_help_and_bad_arguments_do_not_import(startup, module):
    assert imported(startup, module) == [], f"{module} ({HEAVY[module]}) imported while parsing arguments"


def test_the_probe_sees_a_heavy_import():
    """Guard against a check that can never fail: the same probe, after a heavy import."""
    assert imported(probe("import pydantic"), "pydantic")


# what a command that reads the store needs no more than the parser does
NOT_FOR_READING = {
    "sqlalchemy.orm": "the ORM (the store is SQLAlchemy Core)",
    "prefect": "the pipeline's orchestrator (~2 s)",
    "torch": "the model kit and validation",
    "alembic": "migrations (only `loragate init` runs them)",
}

READ = """
import json, sys
from loragate.cli.main import main
code = main(["--json", "list"])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_a_command_that_reads_the_store_imports_only_the_store(tmp_path):
    """``loragate --json list`` against a fresh SQLite registry imports SQLAlchemy Core and
    the store -- what opening it needs -- and none of the heavier neighbours."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_ACTOR": "test"}
    for name in ("LORAGATE_DATABASE_URL", "LORAGATE_ARTIFACTS", "LORAGATE_TOKEN"):
        env.pop(name, None)
    init = subprocess.run(
        [sys.executable, "-m", "loragate.cli.main", "init"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert init.returncode == 0, init.stderr
    proc = subprocess.run(
        [sys.executable, "-c", READ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0 and imported(result, "sqlalchemy")
    heavy = {m: NOT_FOR_READING[m] for m in NOT_FOR_READING if imported(result, m)}
    assert heavy == {}
