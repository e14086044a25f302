"""Which version answers a client's request: the routing table and the sticky split.

The table holds, per adapter, the version its ``production`` pointer names and its active
canary window (id, canary version, share), as the registry says (``registry_reader.routes``).
A client's request for an adapter goes to the canary when its user's bucket falls below the
window's share, else to production. The bucket is an HMAC of the user under the window's own
secret (``canary_windows.bucket_key``, random per window, read only by the replicas), so the
decision needs no state and is the same on every replica behind any balancer, a new window
reshuffles who sees the canary -- and no client can compute its bucket to choose a version.
A window without a secret sends nobody to the canary.

A version is served under the adapter's plain name where the replica's index names that
version for its role (it is what the resolver and the fleet put there) and vLLM has the plain
name, if loaded, from that version's own path (not yet the version a move has just sent
users to, while the fleet settles it), else under the
qualified name ``name@version``, which only loragate may name (``traffic.TrafficSplit``
refuses it from clients) and the resolver resolves to the version's own immutable path.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

QUALIFIER = "@"
# a version id as loragate writes them; anything else is no version (and no path)
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Route:
    adapter: str
    production: str | None
    window: int | None = None
    canary: str | None = None
    share: float = 0.0
    # the window's bucket secret: never shown (as_dict, repr), never sent anywhere
    bucket_key: str | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"production": self.production, "window": self.window, "canary": self.canary, "share": self.share}


@dataclass(frozen=True)
class Decision:
    """The version a request goes to first, and the adapter's active window (both sides of a
    window are labelled with it: the verdict compares them over the same time)."""

    version: str
    window: int | None
    canary: bool


def routes_from_rows(production_rows: list[tuple], window_rows: list[tuple]) -> dict[str, Route]:
    """The table from the registry's rows: (adapter name, production version) and (window id,
    adapter name, canary version, share, bucket secret). A share outside 0..1 is clamped; a
    window of an adapter with no production has nothing to split against and is left out."""
    production = {str(name): str(version) for name, version in production_rows if name and version}
    table: dict[str, Route] = {name: Route(name, version) for name, version in production.items()}
    for window_id, name, version, share, bucket_key in window_rows:
        if name not in production or not version:
            continue
        try:
            fraction = min(1.0, max(0.0, float(share or 0.0)))
        except (TypeError, ValueError):
            fraction = 0.0
        secret = bucket_key if isinstance(bucket_key, str) and bucket_key else None
        table[name] = Route(name, production[name], int(window_id), str(version), fraction, secret)
    return table


def bucket(bucket_key: str, user: str) -> float:
    """The user's place in [0, 1) for the window whose secret is ``bucket_key``: the same on
    every replica, unknowable without the secret. ``user`` is text that encodes as UTF-8 (the
    split refuses any other with a 400)."""
    digest = hmac.new(bucket_key.encode(), user.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def unit(route: Route, user: str) -> int | None:
    """The user's unit while a window is open: a 64-bit keyed hash under the window's secret,
    apart from its bucket (a report of units says nothing of who is in the canary's share,
    nor who the users are); None outside a window."""
    if route.window is None or route.bucket_key is None:
        return None
    digest = hmac.new(route.bucket_key.encode(), b"unit\0" + user.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big")


def decide(route: Route, user: str) -> Decision:
    """Canary when the window has a share and a secret, and the user's bucket falls below it."""
    if (
        route.window is not None
        and route.canary
        and route.share > 0
        and route.bucket_key is not None
        and bucket(route.bucket_key, user) < route.share
    ):
        return Decision(route.canary, route.window, True)
    assert route.production is not None
    return Decision(route.production, route.window, False)


def qualified(name: str, version: str) -> str:
    return f"{name}{QUALIFIER}{version}"


def split_qualified(lora_name: str) -> tuple[str, str] | None:
    """(adapter name, version) of a qualified name; None for a plain one or a malformed one."""
    name, sep, version = lora_name.rpartition(QUALIFIER)
    if not sep or not name or not _VERSION.match(version):
        return None
    return name, version


def served_name(
    name: str, version: str, index_version: str | None, loaded: Container[str] = (), plain_version: str | None = None
) -> str:
    """The name this replica serves ``version`` of ``name`` under (module docstring); where
    the plain name is not loaded but the qualified one is (a move that only changed where
    users go: the fleet unloaded the plain name), the warm qualified one, not a load.
    ``plain_version``: the version whose path the plain name is loaded from, where known;
    another version's (a move the fleet has not settled, or a replica it could not reach
    while the index moved) never answers for ``version``."""
    warm = qualified(name, version)
    if index_version != version or (name not in loaded and warm in loaded):
        return warm
    if plain_version is not None and plain_version != version:
        return warm
    return name


def path_version(path: object) -> str | None:
    """The version a loaded adapter's path is of: its last component (loragate places every
    version at ``<adapter dir>/<name>/<version>``); None where that is no version id."""
    if not isinstance(path, str) or not path:
        return None
    last = path.rstrip("/").rpartition("/")[2]
    return last if _VERSION.match(last) else None
