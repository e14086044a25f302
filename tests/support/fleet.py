"""A fleet for tests on real replicas: a registry of the test's own with the replicas in it
and two versions of one adapter name -- the support adapter (v1) and the tickets adapter
(v2) -- validated on a golden set of both tasks and signed, so what a replica answers tells
which version it serves.

The two adapters are validated once per session (``validate_adapters``, behind the
``validated_adapters`` fixture): the weights, the base and the golden set are the same for
every test, so the reports are too. ``make_fleet`` registers them in a fresh registry under
a fresh name and records those reports for the new version ids, as the gate would have.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from kit.tenant_tasks import golden_cases, prompt_for
from loragate.registry.records.adapters import utcnow
from loragate.registry.records.reports import ValidationReport
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch
from loragate.tasks.replicas import ReplicaClient, replica_client
from loragate.tasks.validation import ValidationPolicy, validate_versions
from tests.support.registries import IN_PROCESS, sign

SUPPORT_PROMPT = prompt_for("support", "reset password")
# each version passes exactly half of the mixed golden set
PASS_THRESHOLD = 0.5


@dataclass(frozen=True)
class ValidatedAdapters:
    """The tiny base, the fleet tests' two bundles, and what validating them reported."""

    base: Path
    support_bundle: Path
    tickets_bundle: Path
    support_report: ValidationReport
    tickets_report: ValidationReport


@dataclass
class Fleet:
    registry: Registry
    name: str
    v1: str
    v2: str
    replicas: dict
    validated: ValidatedAdapters

    def promote(self, version: str, to: str):
        return promote_and_switch(self.registry, version, to)

    def rollback(self, stage: str = "production"):
        return rollback_and_switch(self.registry, self.name, stage)

    def path(self, version: str) -> str:
        return version_path(self.registry.list_replicas()[0].adapter_dir, self.name, version)


def point_replicas(replicas, database_url: str) -> None:
    """Put the registry at ``database_url`` behind the session's replicas: what their plugin
    asks before it serves or loads a version (re-read on every question)."""
    from loragate.local.replica_secrets import replica_registry_url, write_replica_secrets

    for directory in {r.secrets_dir for r in replicas if getattr(r, "secrets_dir", None) is not None}:
        key = (directory / "admin-key").read_text()
        write_replica_secrets(directory, key, replica_registry_url(database_url))


def admin_client(registry: Registry, url: str, retries: int = 2) -> ReplicaClient:
    """A client of the fleet control: it sends the replicas' admin key on loads and unloads."""
    return replica_client(registry, url, retries=retries)


def served(replica) -> dict[str, str]:
    """What the replica serves, read as the fleet reads it: with its key (a keyless read of
    ``/v1/models`` lists the base alone)."""
    with ReplicaClient(replica.url, admin_key=(replica.secrets_dir / "admin-key").read_text()) as client:
        return client.served_adapters()


def serves_version(replica, name: str, version: str, path: str) -> bool:
    """Whether the replica answers ``name`` from ``path``: under the plain name, or -- where a
    move only sent users there -- the warm ``name@version`` with the plain name gone."""
    found = served(replica)
    if name in found:
        return found[name] == path
    return found.get(f"{name}@{version}") == path


def answer(url: str, name: str, prompt: str = SUPPORT_PROMPT, max_tokens: int = 32) -> str:
    with ReplicaClient(url) as client:
        return client.complete(name, prompt, max_tokens).text.strip()


def mixed_golden_set(path):
    """Four support cases and four tickets cases: each version passes exactly half."""
    cases = golden_cases("support")[:4] + golden_cases("tickets")[:4]
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    return path


def _open_registry(tmp_path: Path, base: Path, **overrides) -> Registry:
    settings = Settings(
        **{
            "home": tmp_path / "home",
            "database_url": f"sqlite:///{tmp_path / 'registry.db'}",
            "artifacts": str(tmp_path / "artifacts"),
            "actor": "fleet-test",
            **overrides,
        }
    )
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(base), "tiny-llama")
    return registry


def registry_behind(tmp_path: Path, base: Path, replicas: dict) -> Registry:
    """A registry of the test's own with ``base`` pinned, behind the session's replicas."""
    registry = _open_registry(tmp_path, base)
    point_replicas(replicas.values(), registry.settings.database_url)
    return registry


def validate_adapters(tmp_path: Path, tiny_base: Path, support_bundle: Path, tickets_bundle: Path) -> ValidatedAdapters:
    """Validate both bundles under one name on the mixed golden set, as a first validation
    of a new adapter: no earlier run to compare with, no production."""
    registry = _open_registry(tmp_path, tiny_base)
    try:
        name = "validated/tiny-llama/support"
        v1 = registry.register_adapter(support_bundle, name).version.version_id
        v2 = registry.register_adapter(tickets_bundle, name).version.version_id
        registry.attach_golden_set(name, mixed_golden_set(tmp_path / "golden.jsonl"))
        policy = ValidationPolicy.from_settings(registry.settings, pass_threshold=PASS_THRESHOLD)
        reports = validate_versions(registry, [v1, v2], policy)
        assert [r.status for r in reports] == ["passed", "passed"], [r.failures for r in reports]
    finally:
        registry.close()
    return ValidatedAdapters(tiny_base, support_bundle, tickets_bundle, *reports)


def record_passed(registry: Registry, version_id: str, report: ValidationReport) -> None:
    """Record ``report`` (validated under another registry's ids) as ``version_id``'s
    validation, then sign the version: what the validate gate leaves behind."""
    version = registry.get_version(version_id)
    now = utcnow()
    registry.record_validation(
        version_id, report.model_copy(update={"version_id": version_id, "name": version.name, "run_id": None}), now, now
    )
    sign(registry, version_id)


def attach_mixed_golden_set(registry: Registry, name: str, path: Path, validated: ValidatedAdapters) -> None:
    """The golden set the reports were made on: its outputs are what replicas must answer."""
    ref = registry.attach_golden_set(name, mixed_golden_set(path))
    assert ref.digest == validated.support_report.golden_set_digest == validated.tickets_report.golden_set_digest


def make_fleet(tmp_path, replicas, replica_adapters, validated: ValidatedAdapters, **overrides) -> Fleet:
    registry = _open_registry(tmp_path, validated.base, **overrides)
    point_replicas(replicas.values(), registry.settings.database_url)
    for replica in replicas.values():
        registry.add_replica(replica.url, "tiny-llama", replica.role, str(replica_adapters))
    name = f"t{uuid.uuid4().hex[:8]}/tiny-llama/support"
    v1 = registry.register_adapter(validated.support_bundle, name).version.version_id
    v2 = registry.register_adapter(validated.tickets_bundle, name).version.version_id
    attach_mixed_golden_set(registry, name, tmp_path / "golden.jsonl", validated)
    record_passed(registry, v1, validated.support_report)
    record_passed(registry, v2, validated.tickets_report)
    return Fleet(registry, name, v1, v2, replicas, validated)
