"""Live traffic through the canary: the fleet's side of the split every production replica makes.

The split itself runs inside each production replica (the plugin's ``TrafficSplit``): it
reads the adapters' production pointers and the active canary window's share from the
registry and sends each user to one version, sticky per user. What loragate does around it:

- **warm** the canary on every production replica under its qualified name
  (``name@version``) before any user gets it: the copy written and its production signature
  checked, the load checked byte for byte by the replica against the registry, the golden
  answers compared with shadow validation's -- the gate a fleet switch applies;
- **push** the routing table at once after a share or pointer change, instead of waiting for
  the replicas' own refresh (a second), so a withdrawn canary or a rollback gets 0 % at once;
- **confirm** per replica, by the ``x-loragate-version`` header of a one-token request,
  which version users get now;
- **read** the live figures of every production replica for the canary's evaluation
  (``tasks/live_figures.py``).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from loragate.registry.errors import DeployFailed, ErrorCode, InvalidInput, NotFound, ReplicaError
from loragate.registry.progress import Progress, quiet
from loragate.registry.retrying import is_replica_unavailable
from loragate.registry.rules.canary import CanaryWindow
from loragate.registry.rules.fleet import Placement, Replica, qualified_name, version_path
from loragate.registry.service import Registry
from loragate.tasks.copies import materialize_for
from loragate.tasks.replica_switch import switch_replica, verify_replica
from loragate.tasks.replicas import replica_client
from loragate.tasks.routes import failures, on_each, production_replicas, push_routes, serves_warm

# -- warm and cool -------------------------------------------------------------------------


def warm_version(registry: Registry, name: str, version_id: str, progress: Progress = quiet) -> list[dict[str, Any]]:
    """Serve ``version_id`` as ``name@version_id`` on every production replica of the base,
    verified like a switch (copy signature, bytes, golden answers); a replica that already
    serves it from its path is only verified again. Returns a report per replica.

    Raises:
        DeployFailed: a replica could not load or verify it (those that did keep it loaded:
            no user reaches it before a share is given, and ``cool_version`` drops it).
    """
    served_as = qualified_name(name, version_id)
    expected = registry.expected_outputs(version_id)
    agreement = registry.settings.deploy_agreement

    def placement(replica: Replica) -> Placement:
        return Placement(served_as, version_id, version_path(replica.adapter_dir, name, version_id))

    replicas = production_replicas(registry, name)
    # one copy per adapter directory, written before the loads: replicas sharing a volume
    # must not race to publish the same path
    written: set[str] = set()
    for replica in replicas:
        if placement(replica).path not in written:
            materialize_for(registry, replica, placement(replica))
            written.add(placement(replica).path)

    def warm(replica: Replica) -> dict[str, Any]:
        started = time.perf_counter()
        wanted = placement(replica)
        with replica_client(registry, replica.url) as client:
            if client.served_adapters().get(served_as) != wanted.path:
                switch_replica(client, served_as, wanted.path)
            verification = verify_replica(client, replica, wanted, expected, agreement)
        return {
            "replica": replica.url,
            "served_as": served_as,
            "verified": f"{verification.matched}/{verification.total} golden outputs",
            "seconds": round(time.perf_counter() - started, 3),
        }

    results = on_each(replicas, warm)
    failed = failures(results)
    if failed:
        raise DeployFailed(f"{served_as} could not be warmed on every production replica: {'; '.join(failed)}")
    for report in results.values():
        progress(f"{report['replica']}: {served_as} warm, {report['verified']}")  # type: ignore[index]
    return [r for r in results.values() if isinstance(r, dict)]


def cool_version(registry: Registry, name: str, version_id: str, progress: Progress = quiet) -> None:
    """Drop ``name@version_id`` from every production replica (best effort: reconcile and the
    registry's refusal to serve it cover one that cannot be reached now)."""
    served_as = qualified_name(name, version_id)

    def cool(replica: Replica) -> bool:
        with replica_client(registry, replica.url, retries=1) as client:
            return client.unload(served_as)

    for failure in failures(on_each(production_replicas(registry, name), cool)):
        progress(f"{served_as} not unloaded from {failure}")


# -- the split -----------------------------------------------------------------------------


def open_split(registry: Registry, window: CanaryWindow, progress: Progress = quiet) -> list[dict[str, Any]]:
    """Give the canary its share of live traffic: warm on every production replica first,
    then the routes pushed. A window with share 0 (a dark canary) only gets the probes."""
    if window.share <= 0 or not production_replicas(registry, window.adapter_name):
        return []
    report = warm_version(registry, window.adapter_name, window.version_id, progress)
    push_routes(registry, window.adapter_name, progress)
    progress(f"{window.adapter_name}: {window.share:.2%} of live requests to {window.version_id}")
    return report


def set_share(
    registry: Registry, name: str, share: float, reason: str | None = None, progress: Progress = quiet
) -> CanaryWindow:
    """Change the running canary's share and push it to the replicas. A share above 0 on
    a window whose canary is not warm yet warms it first (nothing changes if that fails).

    Raises:
        InvalidInput: INVALID_SHARE, a share outside [0, 1].
        NotFound: the adapter has no active canary window.
        PermissionDenied: SHARE_ABOVE_CAP, above the operator's cap with no person's sign-off
            pending (nothing warmed, nothing changed).
        DeployFailed: the canary could not be warmed (the share is unchanged).
    """
    # refused before any replica is warmed for it: a bad share, no window, above the cap
    window = registry.check_canary_share(name, share)
    if 0 < share <= 1:
        missing = [
            r for r in production_replicas(registry, name) if not serves_warm(registry, r, name, window.version_id)
        ]
        if missing:
            warm_version(registry, name, window.version_id, progress)
    window = registry.set_canary_share(name, share, reason=reason)
    push_routes(registry, name, progress)
    return window


# -- feedback ------------------------------------------------------------------------------

FEEDBACK_OUTCOMES = ("accepted", "retried")


def adapter_of_request_id(request_id: str) -> str:
    """The adapter a replica's sealed request id names: its first part, the only one anyone
    can read (the replica that gets the feedback opens and checks the rest).

    Raises:
        InvalidInput: INVALID_FEEDBACK, not a request id a replica gave.
    """
    adapter = None
    if isinstance(request_id, str) and request_id.count(".") == 1:
        part = request_id.split(".")[0]
        try:
            adapter = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode()
        except (ValueError, binascii.Error, UnicodeDecodeError):
            adapter = None
    if not adapter:
        raise InvalidInput(
            "not a request id a replica gave (x-loragate-request-id)",
            code=ErrorCode.INVALID_FEEDBACK,
            field="request_id",
        )
    return adapter


def check_feedback(request_id: str, outcome: str) -> str:
    """The adapter the feedback is for, once the outcome and the id's form are right.

    Raises:
        InvalidInput: INVALID_FEEDBACK naming ``outcome`` or ``request_id``.
    """
    if outcome not in FEEDBACK_OUTCOMES:
        raise InvalidInput(
            f"outcome must be one of {', '.join(FEEDBACK_OUTCOMES)}", code=ErrorCode.INVALID_FEEDBACK, field="outcome"
        )
    return adapter_of_request_id(request_id)


def send_feedback(registry: Registry, request_id: str, outcome: str) -> dict[str, Any]:
    """Tell a production replica of the answer's adapter that its user accepted it or asked
    again; the replica checks the id's signature (any replica can) and counts it once.

    Raises:
        InvalidInput: INVALID_FEEDBACK, an outcome other than accepted/retried or a
            malformed id.
        NotFound: the adapter is unknown or has no production replica.
        ReplicaError: no replica could be reached, or it refused the id (forged, altered).
    """
    name = check_feedback(request_id, outcome)
    registry.get_adapter(name)
    replicas = production_replicas(registry, name)
    if not replicas:
        raise NotFound(f"{name} has no production replica to take feedback", field="request_id")
    last: ReplicaError | None = None
    for replica in replicas:
        try:
            with replica_client(registry, replica.url, retries=1) as client:
                return {**client.feedback(request_id, outcome), "replica": replica.url}
        except ReplicaError as e:
            # an unavailable replica: another may take it; a refusal stands
            if not is_replica_unavailable(e):
                raise
            last = e
    assert last is not None
    raise last
