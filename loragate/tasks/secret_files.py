"""The file names in loragate's secrets directories, each spelled once: one file per secret,
read by name, so whoever writes a directory and whoever reads it must agree on every name.

- **A pool worker's** (``LORAGATE_SECRETS_DIR``; a Kubernetes Secret per pool, a 0700
  directory per pool locally): read by ``tasks/credentials.py``, written by its
  ``write_pool_secrets`` and, for the fleet-control pools, ``local/replica_secrets.py``'s
  ``hand_admin_key``.
- **A replica's** (``LORAGATE_REPLICA_SECRETS_DIR``): written by ``local/replica_secrets.py``,
  read by the vLLM plugin -- a package of its own (``infra/vllm_plugin``) that cannot import
  loragate and spells the names again; the tests hold both to the same names. A developer's
  shell keeps its replicas' directory under ``LORAGATE_HOME``, where the shell's fleet
  control finds the admin key (``tasks/replicas.py``).

Standard library only: the replica launcher and the CLI import these names while starting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loragate.registry.rules.access import Role

# -- a pool worker's ---------------------------------------------------------------------

SIGNING_KEY_FILE = "signing-key.pem"
SLACK_TOKEN_FILE = "slack-token"
# the worker's role's own database user (Postgres); absent on SQLite
DATABASE_URL_FILE = "database-url"
# the replicas' admin key, held only by the pools that switch replicas
REPLICA_ADMIN_KEY_FILE = "replica-admin-key"


def token_file(role: Role) -> str:
    """The API token of ``role``: a worker holds only its pool's."""
    return f"token-{role.value}"


# -- a replica's -------------------------------------------------------------------------

# the fleet's key for the replica's admin API; the same key as REPLICA_ADMIN_KEY_FILE's
ADMIN_KEY_FILE = "admin-key"
REGISTRY_URL_FILE = "registry-url"
# seals the request ids the split gives (feedback): the replicas' alone, never a pool's
FEEDBACK_KEY_FILE = "feedback-key"
# a developer's shell: its replicas' secrets directory, under LORAGATE_HOME
HOME_REPLICA_SECRETS_DIR = "replica-secrets"
