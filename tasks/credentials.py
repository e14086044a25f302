"""What a flow run acts with: one API token per gate role, the signing key and the Slack
token, read from Prefect Secret blocks inside the run.

Never parameters (Prefect stores and shows those) and never the deployment's environment:
a Secret block is encrypted at rest by the Prefect server, shown masked in the UI, and
rotated in one place. Each gate opens the registry with the token of the least role it
needs, so a register run cannot move a pointer even if its code were wrong. Where a block
is missing (a developer's shell), the worker's ``LORAGATE_*`` settings are used instead.
"""

from __future__ import annotations

from registry.rules.access import Role
from registry.service import Registry
from registry.settings import Settings


def token_block(role: Role) -> str:
    return f"loragate-token-{role.value}"


SIGNING_KEY_BLOCK = "loragate-signing-key"
SLACK_TOKEN_BLOCK = "loragate-slack-token"


def read_secret(block: str) -> str | None:
    """The Secret block's value, None when there is no such block."""
    from prefect.blocks.system import Secret

    try:
        secret = Secret.load(block, _sync=True)  # type: ignore[call-arg]
    except ValueError:  # Prefect's "no block document named ..."
        return None
    value = secret.get()  # type: ignore[union-attr]
    return str(value) if value else None


def settings_for(role: Role) -> Settings:
    token = read_secret(token_block(role))
    return Settings(token=token) if token else Settings()


def registry_as(role: Role) -> Registry:
    """The registry, acting with the gate role's token."""
    return Registry.open(settings_for(role))


def slack_settings() -> Settings:
    token = read_secret(SLACK_TOKEN_BLOCK)
    return Settings(slack_token=token) if token else Settings()


def signing_key() -> bytes | None:
    pem = read_secret(SIGNING_KEY_BLOCK)
    return pem.encode() if pem else None


def store_pipeline_secrets(tokens: dict[Role, str], signing_key_pem: bytes | None, slack_token: str | None) -> None:
    """Save the pipeline's credentials as Secret blocks (``make demo``, tests, an operator's
    bootstrap script); an existing block is overwritten."""
    from prefect.blocks.system import Secret

    for role, token in tokens.items():
        Secret(value=token).save(token_block(role), overwrite=True)
    if signing_key_pem is not None:
        Secret(value=signing_key_pem.decode()).save(SIGNING_KEY_BLOCK, overwrite=True)
    if slack_token is not None:
        Secret(value=slack_token).save(SLACK_TOKEN_BLOCK, overwrite=True)
