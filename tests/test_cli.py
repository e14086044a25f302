"""The installed ``loragate`` console script, as a user runs it: exit codes, stderr, --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.tenant_tasks import write_golden_set
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.commands import cli_runner
from tests.support.registries import IN_PROCESS

LORAGATE = str(Path(sys.executable).parent / "loragate")
NAME = "acme/tiny-llama/support"


@pytest.fixture
def cli(tmp_path):
    env = {**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_ACTOR": "cli-test"}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)
    return cli_runner(env, tmp_path / "home")


def test_register_resolve_and_promote_through_the_console_script(cli, tiny_base, random_bundle):
    assert cli("init").returncode == 0
    base = cli("base", "add", str(tiny_base), "--id", "tiny-llama", "--json")
    assert base.returncode == 0 and json.loads(base.stdout)["created"] is True
    reg = cli("register", str(random_bundle), "--name", NAME)
    assert reg.returncode == 0
    version = reg.stdout.strip()
    again = cli("register", str(random_bundle), "--name", NAME, "--json")
    assert again.returncode == 0
    assert json.loads(again.stdout)["version_id"] == version and json.loads(again.stdout)["created"] is False

    listed = json.loads(cli("list", "--json").stdout)
    assert [v["version_id"] for v in listed] == [version]

    denied = cli("promote", version, "--to", "canary")
    assert denied.returncode == 2
    assert denied.stderr.startswith("error: validation_required [validation_status]: ")
    assert denied.stdout == ""

    missing = cli("resolve", NAME)
    assert missing.returncode == 2 and "no production version" in missing.stderr


def test_an_uninitialised_registry_says_how_to_fix_it(cli):
    result = cli("list")
    assert result.returncode == 2
    assert "run `loragate init`" in result.stderr


def test_argument_errors_exit_2(cli):
    assert cli("promote", "x", "--to", "staging").returncode == 2
    assert cli("frobnicate").returncode == 2


def test_bad_settings_exit_2_naming_the_variable(cli, tmp_path):
    env_result = subprocess.run(
        [LORAGATE, "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LORAGATE_HOME": str(tmp_path), "LORAGATE_MAX_LORA_RANK": "12"},
    )
    assert env_result.returncode == 2
    assert "[LORAGATE_MAX_LORA_RANK]" in env_result.stderr


# -- what a command costs to start: read-only commands stay light -------------------

HEAVY = {"torch", "transformers", "peft", "prefect", "great_expectations", "pandas"}
PROBE = (
    "import json, sys\n"
    "from loragate.cli.main import main\n"
    "rc = main(sys.argv[1:])\n"
    "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})), file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def loaded_modules(env: dict, *args: str) -> tuple[int, set[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, timeout=300)
    return proc.returncode, set(json.loads(proc.stderr.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def populated_cli(tmp_path_factory, tiny_base, random_bundle):
    """A registry with a base, a version and a golden set, shared by the read-only checks."""
    home = tmp_path_factory.mktemp("populated")
    env = {**os.environ, "LORAGATE_HOME": str(home / "home"), "LORAGATE_ACTOR": "cli-test"}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)
    run = cli_runner(env, home / "home")
    assert run("init").returncode == 0
    assert run("base", "add", str(tiny_base), "--id", "tiny-llama").returncode == 0
    version = run("register", str(random_bundle), "--name", NAME).stdout.strip()
    assert run("golden", "set", NAME, str(write_golden_set("support", home / "golden.jsonl"))).returncode == 0
    with Registry.open(Settings(home=home / "home"), principal=IN_PROCESS) as registry:
        signing = registry.create_token("signing", "validator")[1]
    return {**env, "LORAGATE_TOKEN": signing}, version


@pytest.mark.parametrize(
    "argv",
    [
        ["resolve", NAME, "--stage", "production"],
        ["list"],
        ["show", "{version}"],
        ["history", NAME],
        ["base", "list"],
        ["golden", "show", NAME],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_read_only_commands_import_no_model_stack_and_no_prefect(populated_cli, argv):
    env, version = populated_cli
    rc, modules = loaded_modules(env, *[a.format(version=version) for a in argv])
    assert rc in (0, 2)  # nothing is in production: resolve exits 2, after the same imports
    assert modules & HEAVY == set()


def test_the_probe_would_see_a_heavy_import(populated_cli):
    env, _ = populated_cli
    proc = subprocess.run(
        [sys.executable, "-c", "import torch\n" + PROBE, "list"], capture_output=True, text=True, env=env, timeout=300
    )
    assert "torch" in json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [["--json", "list"], ["list", "--json"], ["--json", "base", "list"], ["base", "list", "--json"]],
    ids=lambda a: " ".join(a),
)
def test_json_works_before_or_after_the_subcommand(populated_cli, argv):
    env, _ = populated_cli
    proc = subprocess.run([LORAGATE, *argv], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout), list)


def test_errors_are_json_whichever_side_json_is_on(populated_cli):
    env, _ = populated_cli
    for argv in (["--json", "resolve", "nobody/tiny-llama/x"], ["resolve", "nobody/tiny-llama/x", "--json"]):
        proc = subprocess.run([LORAGATE, *argv], capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["code"] == "not_found"


@pytest.mark.slow
def test_validate_runs_the_gate_without_importing_prefect(populated_cli):
    env, version = populated_cli
    rc, modules = loaded_modules(env, "validate", version)
    assert rc == 1  # the random adapter fails its golden set: the whole gate ran
    assert {"torch", "peft"} <= modules and "prefect" not in modules
