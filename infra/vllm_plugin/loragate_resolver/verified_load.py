"""The engine loads exactly the bytes that were checked: a verifying loader in the worker.

The resolver and the admin guard check a bundle in the API server, then hand vLLM a path;
the engine reads the files later -- at the load, and again whenever its LRU evicted the
adapter (``max_cpu_loras``) and a request needs it back. Whoever writes the adapter volume
could swap the files in between. So the worker's own loader is wrapped: it reads the
bundle's three files into memory once, hashes those bytes against the digests the registry
recorded for (name, version) (``registry_reader``), writes them into a directory private to
this process and hands vLLM that copy, removed once loaded. What is loaded is what was
hashed, on every load and reload; anything else is "not found" (vLLM's 404).

The manifest at the path names the version; its digest is the registry's too. While the
registry cannot be read, a (name, version) this process loaded before is loaded again
against the digests it had then (they never change for a version): an outage must not make
an evicted production adapter unservable. The private directory is
``LORAGATE_LOAD_DIR`` (default: a fresh 0700 directory under ``/dev/shm`` or the temp dir).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from loragate_resolver import registry_reader

MANIFEST = registry_reader.MANIFEST_FILE
FILES = (registry_reader.WEIGHTS_FILE, registry_reader.ADAPTER_CONFIG_FILE, MANIFEST)
_KNOWN_MAX = 4096

log = logging.getLogger("loragate_resolver.verified_load")

# (name, version) -> file digests the registry gave this process (outage fallback, module doc)
Expect = Callable[[str, str], dict]


class Refused(Exception):
    """Not a bundle this replica may load (the message says why)."""


def inside(adapter_dir: str, path: str) -> str | None:
    """``path`` resolved, when it lies inside ``adapter_dir`` and no part of it below the
    directory is a symbolic link (a link could be re-aimed between a check and the load);
    None otherwise."""
    if not os.path.isabs(path):
        return None
    real_dir = os.path.realpath(adapter_dir)
    below = os.path.relpath(os.path.normpath(path), os.path.normpath(adapter_dir))
    if below == "." or below.startswith(".."):
        return None
    real_path = os.path.realpath(path)
    if real_path != os.path.join(real_dir, below):
        return None
    return real_path


class CheckedLoads:
    """Reads, checks and copies a bundle for one load (``copy``)."""

    def __init__(self, adapter_dir: str, expect: Expect, load_dir: str | None = None) -> None:
        self.adapter_dir = adapter_dir
        self.expect = expect
        self.load_dir = load_dir
        self.known: dict[tuple[str, str], dict] = {}

    def _digests(self, name: str, version: str) -> dict:
        try:
            files = self.expect(name, version)
        except registry_reader.NotServable as e:
            known = self.known.get((name, version))
            if e.code != "registry_unavailable" or known is None:
                raise Refused(f"{name} = {version}: {e} ({e.code})") from e
            log.warning(
                "loragate: registry unreachable; %s = %s loaded here before, checked against those digests",
                name,
                version,
            )
            return known
        if len(self.known) >= _KNOWN_MAX:
            self.known.clear()
        self.known[(name, version)] = files
        return files

    def copy(self, name: str, path: str) -> str:
        """A private directory holding the bundle at ``path``, byte for byte what the registry
        recorded for ``name`` (the caller removes it).

        Raises:
            Refused: outside the adapter directory, unreadable, not servable, or a file that
                does not hash to its digest.
        """
        real_path = inside(self.adapter_dir, path)
        if real_path is None:
            raise Refused(f"{path} is not a directory inside {self.adapter_dir} reached through no link")
        contents = {}
        for file in FILES:
            try:
                with open(os.path.join(real_path, file), "rb") as f:
                    contents[file] = f.read()
            except OSError as e:
                raise Refused(f"{path}: {file} unreadable ({type(e).__name__})") from e
        try:
            import json

            version = json.loads(contents[MANIFEST]).get("adapter_version")
        except (ValueError, AttributeError) as e:
            raise Refused(f"{path}: no manifest naming a version") from e
        if not isinstance(version, str):
            raise Refused(f"{path}: no manifest naming a version")
        digests = self._digests(name, version)
        damaged = [f for f in FILES if hashlib.sha256(contents[f]).hexdigest() != digests.get(f)]
        if damaged:
            raise Refused(f"{path}: {', '.join(damaged)} do(es) not match the registry's digests for {version}")
        copy = tempfile.mkdtemp(prefix="loragate-load-", dir=self.load_dir)
        for file, data in contents.items():
            with open(os.path.join(copy, file), "wb") as out:
                out.write(data)
        return copy


def _load_dir() -> str | None:
    chosen = os.environ.get("LORAGATE_LOAD_DIR")
    if chosen:
        return chosen
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def install(adapter_dir: str, role: str) -> bool:
    """Wrap the worker's LoRA loader (vLLM 0.32's ``WorkerLoRAManager._load_adapter``); False,
    and nothing patched, on a vLLM without it."""
    try:
        import msgspec
        from vllm.exceptions import LoRAAdapterNotFoundError
        from vllm.lora.worker_manager import WorkerLoRAManager
    except Exception:
        log.warning("loragate: vLLM's WorkerLoRAManager not found; loads are checked in the API server only")
        return False
    original = getattr(WorkerLoRAManager, "_load_adapter", None)
    if original is None or getattr(original, "loragate", False):
        return original is not None
    secrets_dir = os.environ.get(registry_reader.SECRETS_DIR_VARIABLE)
    checks = CheckedLoads(
        adapter_dir,
        lambda name, version: registry_reader.expected_files(secrets_dir, role, name, version),
        _load_dir(),
    )

    def _load_adapter(self: Any, lora_request: Any) -> Any:
        try:
            copy = checks.copy(lora_request.lora_name, lora_request.lora_path)
        except Refused as e:
            log.error("loragate: refusing to load %s: %s", lora_request.lora_name, e)
            raise LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path) from e
        try:
            return original(self, msgspec.structs.replace(lora_request, lora_path=copy))
        finally:
            shutil.rmtree(copy, ignore_errors=True)

    _load_adapter.loragate = True  # type: ignore[attr-defined]
    WorkerLoRAManager._load_adapter = _load_adapter
    return True
