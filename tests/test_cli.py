"""The installed ``loragate`` console script, as a user runs it: exit codes, stderr, --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LORAGATE = str(Path(sys.executable).parent / "loragate")
NAME = "acme/tiny-llama/support"


@pytest.fixture
def cli(tmp_path):
    env = {**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_ACTOR": "cli-test"}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([LORAGATE, *args], capture_output=True, text=True, env=env, timeout=120)

    return run


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
    env_result = subprocess.run([LORAGATE, "list"], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "LORAGATE_HOME": str(tmp_path), "LORAGATE_MAX_LORA_RANK": "12"})
    assert env_result.returncode == 2
    assert "[LORAGATE_MAX_LORA_RANK]" in env_result.stderr
