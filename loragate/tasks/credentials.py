"""What a flow run acts with: the API token of the one gate role its worker holds, the
signing key (the signing worker only), the Slack token and, on Postgres, the database URL of
its role's database user (``loragate_<role>``, never the owner's), read from files in the
worker's secrets directory (``LORAGATE_SECRETS_DIR``).

Nothing of it lives on the Prefect server. A self-hosted server has no RBAC: whoever
reaches its API reads a Secret block with ``include_secrets=true``, every parameter,
variable and artifact. So each work pool has its own worker, and each worker its own
directory (on Kubernetes one Secret per pool, mounted only into that pool's pods; locally
a 0700 directory per pool): a flow run can act only as the role of the pool it runs on,
and asking for another role is ``missing_credential``. The directory's path travels in
the environment; the secrets never do. Without a secrets directory (a developer's shell)
the caller's own ``LORAGATE_TOKEN`` settings are used, and without a ``database-url`` file
in it the environment's ``LORAGATE_DATABASE_URL`` (SQLite, which has no users).
"""

from __future__ import annotations

import os
from pathlib import Path

from loragate.registry.errors import ErrorCode, PermissionDenied
from loragate.registry.rules.access import Role
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.tasks.secret_files import DATABASE_URL_FILE, SIGNING_KEY_FILE, SLACK_TOKEN_FILE, token_file

SECRETS_DIR_VARIABLE = "LORAGATE_SECRETS_DIR"


def secrets_dir() -> Path | None:
    value = os.environ.get(SECRETS_DIR_VARIABLE)
    return Path(value) if value else None


def read_secret(name: str) -> str | None:
    """The file's content without surrounding whitespace; None without a secrets directory
    or without that file in it."""
    directory = secrets_dir()
    if directory is None:
        return None
    try:
        value = (directory / name).read_text().strip()
    except FileNotFoundError:
        return None
    return value or None


def settings_for(role: Role) -> Settings:
    """The worker's settings, acting with its ``role`` token.

    Raises:
        PermissionDenied: MISSING_CREDENTIAL when the worker has a secrets directory that
            holds no token of ``role``: the flow runs on another role's work pool.
    """
    directory = secrets_dir()
    if directory is None:
        return Settings()
    token = read_secret(token_file(role))
    if token is None:
        raise PermissionDenied(
            f"this worker holds no {role.value} token ({directory / token_file(role)}): "
            f"the flow runs on a work pool of another role",
            code=ErrorCode.MISSING_CREDENTIAL,
            field=SECRETS_DIR_VARIABLE,
        )
    return _worker_settings(token=token)


def _worker_settings(token: str | None) -> Settings:
    """Settings with ``token`` and, where the secrets directory holds one, the pool's own
    database URL: a flow run connects as its role's database user."""
    url = read_secret(DATABASE_URL_FILE)
    return Settings(token=token, database_url=url) if url else Settings(token=token)


def registry_as(role: Role) -> Registry:
    """The registry, acting with the gate role's token."""
    return Registry.open(settings_for(role))


def registry_reader() -> Registry:
    """The registry for reading only: reads need no token, so none is looked up."""
    return Registry.open(_worker_settings(token=None))


def slack_settings() -> Settings:
    token = read_secret(SLACK_TOKEN_FILE)
    return Settings(slack_token=token) if token else Settings()


def signing_key() -> bytes | None:
    pem = read_secret(SIGNING_KEY_FILE)
    return pem.encode() if pem else None


def write_pool_secrets(
    directory: Path,
    tokens: dict[Role, str],
    signing_key_pem: bytes | None = None,
    slack_token: str | None = None,
    database_url: str | None = None,
) -> Path:
    """A worker's secrets directory (0700, files 0600), as a Kubernetes Secret volume lays
    it out: one file per key. For ``make demo``, the tests and an operator's bootstrap on
    one machine; an existing directory is rewritten."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    files = {token_file(role): token for role, token in tokens.items()}
    if signing_key_pem is not None:
        files[SIGNING_KEY_FILE] = signing_key_pem.decode()
    if slack_token is not None:
        files[SLACK_TOKEN_FILE] = slack_token
    if database_url is not None:
        files[DATABASE_URL_FILE] = database_url
    for stale in directory.iterdir():
        if stale.name not in files:
            stale.unlink()
    for name, value in files.items():
        path = directory / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(value)
        path.chmod(0o600)
    return directory
