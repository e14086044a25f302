"""The demo's replicas obey only the fleet: their secrets directory (the admin key the
fleet-control pools hold, the registry's SQLite file they read what they may serve from),
a load from a caller without the key, refused, and a copy tampered on disk, refused (its
users answered by the base, with the fallback header) and repaired."""

from __future__ import annotations

from pathlib import Path
from secrets import token_urlsafe

from kit.demo_console import HOME, loragate, say
from kit.demo_registry import SUPPORT, registry
from loragate.tasks.secret_files import ADMIN_KEY_FILE, HOME_REPLICA_SECRETS_DIR


def demo_replica_secrets() -> tuple[Path, str]:
    """(the replicas' secrets directory, the admin key), under the demo's home, where
    ``loragate`` run from this shell finds the key too."""
    from loragate.local.replica_secrets import replica_registry_url, write_replica_secrets
    from loragate.registry.settings import Settings

    admin_key = token_urlsafe(32)
    url = replica_registry_url(Settings().database_url)
    return write_replica_secrets(HOME / HOME_REPLICA_SECRETS_DIR, admin_key, url), admin_key


def direct_load_refused(url: str, name: str, version: str) -> None:
    """Anyone who reaches a replica asks it to serve other bytes under production's name:
    without the fleet's admin key the replica refuses (and keeps serving what it served)."""
    from loragate.registry.errors import ReplicaError
    from loragate.registry.rules.fleet import version_path
    from loragate.tasks.replicas import ReplicaClient

    copy = version_path(str(HOME / "adapters"), name, version)
    with ReplicaClient(url) as anyone:
        try:
            anyone.load(name, copy, inplace=True)
        except ReplicaError as e:
            say(f"load_lora_adapter {name} -> {version} without the fleet's key: {e.one_line()}")
            return
    raise SystemExit("the production replica took a load from a caller without the fleet's key")


def tampered_copy_repaired(
    urls: dict[str, str], name: str, version: str, prompt: str, as_fleet: dict[str, str]
) -> None:
    """One byte flipped in the copy the replicas serve: seen, refused, repaired."""
    from kit.tamper import flip_a_byte
    from loragate.registry.errors import ReplicaError
    from loragate.registry.rules.fleet import qualified_name, version_path
    from loragate.tasks.replicas import ReplicaClient

    weights = Path(version_path(str(HOME / "adapters"), name, version)) / "adapter_model.safetensors"
    flip_a_byte(weights)
    say(f"one byte flipped in {weights} (size and mtime as they were)")
    loragate("fleet", "status")
    # as after a restart: the replica is asked for a name it no longer holds, and its
    # resolver finds the copy the index names does not verify (the unload is the fleet's:
    # with the replicas' admin key)
    admin_key = (HOME / HOME_REPLICA_SECRETS_DIR / ADMIN_KEY_FILE).read_text()
    with ReplicaClient(urls["production"], admin_key=admin_key) as client:
        client.unload(name)
        client.unload(qualified_name(name, version))  # the copy kept warm for a rollback, too
        try:
            client.complete(name, prompt, 8, admin=True)
            if not intact(weights, version):
                raise SystemExit("the production replica served the tampered copy")
            say("the fleet pool's scheduled reconcile had already repaired the copy: served as it should be")
        except ReplicaError as e:
            say(f"production replica, asked by the fleet: {e.one_line()} (refused, not garbage)")
        answered = client.complete(name, prompt, 8, user="tenant-user-0")
        if answered.version == "base":
            say(f"a user asking: answered by the base model, x-loragate-fallback: {answered.fallback}")
        elif intact(weights, version):
            say(f"a user asking: answered by {answered.version} from the repaired copy")
        else:
            raise SystemExit(f"a user of the tampered copy was answered by {answered.version}, not the base")
    loragate("fleet", "reconcile", env=as_fleet)  # the fleet pool's role: no admin needed


def intact(weights: Path, version: str) -> bool:
    """Whether the weights file holds the bytes the registry recorded for the version."""
    import hashlib

    with registry() as reg:
        expected = reg.bundle_digests(version)[weights.name]
    return hashlib.sha256(weights.read_bytes()).hexdigest() == expected


def ask(urls: dict[str, str], prompt: str) -> None:
    """Which version each replica answers the demo's adapter with (its version header: under
    the plain name or a warm ``name@version``), and its answer to ``prompt``."""
    import httpx

    for role, url in urls.items():
        body = {"model": SUPPORT, "prompt": prompt, "max_tokens": 8, "temperature": 0, "user": "demo"}
        answered = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        version = answered.headers.get("x-loragate-version", "(no header)")
        say(f"{role:<10} {url} answers {SUPPORT} with {version}: {answered.json()['choices'][0]['text']!r}")
