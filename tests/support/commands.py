"""Running ``loragate`` commands as the role each needs: the role table, one token per
role, and runners of the CLI in this process or as the installed command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loragate.registry.errors import InvalidInput
from loragate.registry.rules.access import Role
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.registries import IN_PROCESS

# the role each mutating command needs (docs/concepts/roles.md#roles); a read needs none
COMMAND_ROLES = {
    "register": "training",
    "golden": "training",
    "validate": "signing",
    "sign": "signing",
    "approve": "activation",
    "approve-code": "activation",
    "base": "admin",
    "fleet": "fleet",
    "replicas": "admin",  # up and down add and remove replicas: a person's (migration 0016)
    "gc": "admin",
    "token": "admin",
    "key": "admin",
}


# a person's pins and which replicas there are: admin, where the rest of `fleet` is the fleet role's
ADMIN_FLEET_COMMANDS = ("pin", "unpin", "add", "remove")


def role_for(argv) -> str | None:
    """The role ``loragate *argv`` runs under in tests."""
    words = [a for a in argv if not a.startswith("-")]
    command = words[0] if words else None
    if command == "fleet" and words[1:2] and words[1] in ADMIN_FLEET_COMMANDS:
        return "admin"
    if command == "promote":
        return "activation" if "production" in argv else "signing"
    if command == "rollback":
        return "activation"
    return COMMAND_ROLES.get(command or "")


def role_tokens(registry) -> dict[str, str]:
    """One token per role, each held by "<role>-tests"."""
    return {role.value: registry.create_token(role.value, f"{role.value}-tests")[1] for role in Role}


def main_with_tokens(tokens: dict[str, str], argv: list[str]) -> int:
    """``loragate.cli.main.main(argv)`` in this process, with the token of the role it needs."""
    from loragate.cli.main import main

    role = role_for(argv)
    saved = os.environ.pop("LORAGATE_TOKEN", None)
    if role and role in tokens:
        os.environ["LORAGATE_TOKEN"] = tokens[role]
    try:
        return main(argv)
    finally:
        os.environ.pop("LORAGATE_TOKEN", None)
        if saved is not None:
            os.environ["LORAGATE_TOKEN"] = saved


def with_token(env: dict, tokens: dict[str, str], argv) -> dict:
    role = role_for(argv)
    return {**env, "LORAGATE_TOKEN": tokens[role]} if role and role in tokens else env


def cli_runner(env: dict, home: Path):
    """Runs the installed ``loragate`` with ``env``, presenting a token of the role each
    command needs; the tokens are made once the registry exists."""
    command = str(Path(sys.executable).parent / "loragate")
    tokens: dict[str, str] = {}

    def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        if role_for(args) and not tokens:
            try:
                with Registry.open(Settings(home=home), principal=IN_PROCESS) as registry:
                    tokens.update(role_tokens(registry))
            except InvalidInput:  # not initialised: the command under test says so itself
                pass
        return subprocess.run(
            [command, *args], capture_output=True, text=True, env=with_token(env, tokens, args), timeout=timeout
        )

    return run
