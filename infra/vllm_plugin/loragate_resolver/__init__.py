"""loragate's LoRA resolver for vLLM: a replica serves what the registry's pointers say,
from its first request, even after a restart.

vLLM asks resolvers only when a request names an adapter the server does not know (with
runtime LoRA updating on), under a per-name lock, once per name until it is unloaded.
This one reads the index loragate writes atomically into the replica's adapter directory
(``LORAGATE_ADAPTER_DIR``) and answers with the path of the version the index names for
the replica's role (``LORAGATE_REPLICA_ROLE``). It needs no database driver and no
Prefect -- only the index file -- and never raises: an exception inside a resolver becomes
a 500 and skips later resolvers, so anything unexpected is "no adapter" instead.

It hands vLLM only bytes that verify, and only versions the registry lets this role serve:
the index on the (writable) volume says only *where* a version lies; the digests and the
permission come from the registry's database, read with a read-only credential
(``registry_reader``). A copy whose files do not match (a flipped byte on disk, a file and
its index digest both rewritten) is refused and logged -- a 404 is better than garbage.
What was hashed is remembered by inode, size, mtime and ctime, so a name resolved again
after an unload costs a few ``stat`` calls and one query. The replica's admin API is
guarded by ``admin_guard``, which checks a load with ``verified`` as well.

It also mends two faults of vLLM 0.32 that a switch in place meets under load
(docs/operations/fleet.md): a request admitted just before its name was unloaded (served
from the index instead of a 404), and a batch holding two versions of one name (both
activated instead of the engine dying); and it keeps a pinned adapter out of the GPU slots,
where a pin can kill the engine (``pin_in_the_cpu_cache_only``, for ``engine_cache``). On
the CPU it keeps the last slot's adapter off every request of the base batched beside an
adapter's (``cpu_lora_ops``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Callable

from loragate_resolver import cpu_lora_ops, qualified, registry_reader, routing, verified_load

INDEX_FILE = ".loragate-index.json"
# 2: entries carry the bundle's file digests (format 1 had none: its entries are not served)
INDEX_FORMAT = 2
_HEX = frozenset("0123456789abcdef")
# (path, inode, size, mtime, ctime) -> SHA-256 of files hashed before; bounded
_hashed: dict[tuple[str, int, int, int, int], str] = {}
_pins_off_the_gpu = False  # pin_in_the_cpu_cache_only patched this process's vLLM

log = logging.getLogger("loragate_resolver")


def read_index(adapter_dir: str) -> dict:
    """The index loragate wrote, or an empty one when there is none or it is unreadable."""
    try:
        with open(os.path.join(adapter_dir, INDEX_FILE), encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError):
        return {"format": INDEX_FORMAT, "roles": {}}
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        return {"format": INDEX_FORMAT, "roles": {}}
    return index


# (adapter name, version id) -> file name -> hex SHA-256 the registry expects; raises
# registry_reader.NotServable when the version may not be served here
Expectations = Callable[[str, str], dict]


def registry_expectations(role: str, secrets_dir: str | None = None, owner_moves: bool | None = None) -> Expectations:
    """What the registry expects, asked for each lookup (never cached: a decision may change
    with every pointer move). ``owner_moves``: None reads this process's flag."""
    directory = secrets_dir if secrets_dir is not None else os.environ.get(registry_reader.SECRETS_DIR_VARIABLE)
    return lambda name, version: registry_reader.expected_files(directory, role, name, version, owner_moves)


def version_path(adapter_dir: str, name: str, version: str) -> str:
    """A version's immutable path: the same layout as registry/rules/fleet.version_path (the
    plugin imports nothing of loragate's)."""
    return os.path.join(adapter_dir, *name.split("/"), version)


def lookup(adapter_dir: str, role: str, lora_name: str, expect: Expectations | None = None) -> tuple[str, str] | None:
    """(version id, path) the index names for ``lora_name`` on a replica of ``role``, when the
    bundle is there, is the version the entry says, and is what the registry lets this role
    serve, byte for byte (``expect``; default: the registry's database). A qualified name,
    ``name@version`` (the live split's, ``routing``), names the version's own path instead of
    an index entry, and is checked the same way."""
    qualified = routing.split_qualified(lora_name)
    if qualified is not None:
        path = version_path(adapter_dir, *qualified)
        if verified(adapter_dir, lora_name, path, expect or registry_expectations(role)) != qualified[1]:
            return None
        return qualified[1], path
    entry = read_index(adapter_dir).get("roles", {}).get(role, {}).get(lora_name)
    if not isinstance(entry, dict):
        return None
    version, path = entry.get("version"), entry.get("path")
    if not (isinstance(version, str) and isinstance(path, str)):
        return None
    if verified(adapter_dir, lora_name, path, expect or registry_expectations(role)) != version:
        return None
    # the path as loragate wrote it: it is what /v1/models shows as the adapter's root, and
    # what loragate compares against what it expects
    return version, path


def verified(adapter_dir: str, lora_name: str, path: str, expect: Expectations) -> str | None:
    """The version at ``path`` when it lies inside ``adapter_dir``, its manifest names a
    version ``expect`` allows under ``lora_name``, and every file hashes to what ``expect``
    says; otherwise None (logged). The index's own digests are never consulted: whoever
    writes the volume writes them too."""
    # only a bundle inside the adapter directory, reached through no link: the path vLLM is
    # handed is then the one hashed here. Its manifest names the version, and the manifest's
    # own digest is the registry's, so that claim cannot be forged either
    real_path = verified_load.inside(adapter_dir, path)
    if real_path is None:
        log.error(
            "loragate: refusing %s at %s: not a directory inside %s reached through no link",
            lora_name,
            path,
            adapter_dir,
        )
        return None
    try:
        with open(os.path.join(real_path, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    version = manifest.get("adapter_version") if isinstance(manifest, dict) else None
    if not isinstance(version, str):
        return None
    try:
        files = expect(lora_name, version)
    except registry_reader.NotServable as e:
        log.error("loragate: refusing %s = %s at %s: %s (%s)", lora_name, version, path, e, e.code)
        return None
    damaged = damaged_files(real_path, files)
    if damaged:
        log.error(
            "loragate: refusing %s = %s at %s: %s do(es) not match the digests the registry recorded",
            lora_name,
            version,
            path,
            ", ".join(damaged),
        )
        return None
    return version


def damaged_files(directory: str, files: object) -> list[str]:
    """The files of ``directory`` that are missing, not regular, or do not hash to what
    ``files`` (name -> hex SHA-256) says; ``["(no digests)"]`` when the entry has none."""
    if not isinstance(files, dict) or not files:
        return ["(no digests)"]
    damaged = []
    for name, digest in sorted(files.items()):
        if not (isinstance(name, str) and isinstance(digest, str) and len(digest) == 64 and set(digest) <= _HEX):
            damaged.append(str(name))
            continue
        if os.sep in name or name in ("", ".", ".."):
            damaged.append(name)
            continue
        if _sha256(os.path.join(directory, name)) != digest:
            damaged.append(name)
    return damaged


def _sha256(path: str) -> str | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not os.path.isfile(path) or os.path.islink(path):
        return None
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _hashed.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return None
    if len(_hashed) >= 4096:
        _hashed.clear()
    _hashed[key] = digest.hexdigest()
    return _hashed[key]


def register() -> None:
    """vLLM's general-plugin entry point (run in the API server, the engine and the workers):
    keep both versions of a name apart in a batch, pins out of the GPU slots and every
    adapter's delta off the base's rows of a batch (``cpu_lora_ops``); when the
    replica is ours, register the resolver, hide qualified names from whoever loragate did
    not choose (``qualified``) and load only bytes that hash to the registry's digests
    (``verified_load``)."""
    keep_each_adapter_of_a_batch()
    pin_in_the_cpu_cache_only()
    cpu_lora_ops.skip_the_base_rows()
    adapter_dir = os.environ.get("LORAGATE_ADAPTER_DIR")
    role = os.environ.get("LORAGATE_REPLICA_ROLE")
    if not adapter_dir or not role:
        return
    qualified.install()
    verified_load.install(adapter_dir, role)
    from vllm.lora.request import LoRARequest
    from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

    class LoragateResolver(LoRAResolver):
        async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
            if not qualified.allowed(lora_name):  # vLLM's own fallback is guarded too
                return None
            try:
                # a database query: off the event loop that serves every other request
                found = await asyncio.to_thread(lookup, adapter_dir, role, lora_name)
            except Exception:  # never let a resolver error become a 500
                log.exception("loragate resolver failed for %s", lora_name)
                return None
            if found is None:
                return None
            version, path = found
            log.info("loragate: %s resolves to %s at %s", lora_name, version, path)
            # the id must be positive; vLLM replaces it with a fresh one of its own on load
            return LoRARequest(lora_name=lora_name, lora_int_id=1, lora_path=path)

    LoRAResolverRegistry.register_resolver("loragate", LoragateResolver())
    close_the_unload_window(adapter_dir, role)


def keep_each_adapter_of_a_batch() -> None:
    """Activate every adapter id a batch uses, also two ids of one name.

    While a name is switched, a batch holds requests of the old version (admitted before)
    and of the new one: one name, two adapter ids. vLLM 0.32 collects the batch's LoRA
    requests in a set, and ``LoRARequest`` hashes and compares by *name*, so one of the two
    is dropped and never activated; when it is not still in a slot from before, the
    mapping names an id with no slot and the engine dies (``KeyError`` in punica's
    ``convert_mapping``, then ``EngineDeadError``). Seen within 2 switches under load at
    ``--max-cpu-loras 4``. Handing the worker one request per id instead fixes it; the
    worker's own code keys them by id from there on.
    """
    try:
        from vllm.v1.worker.gpu_input_batch import InputBatch
    except Exception:  # another vLLM: patch nothing, and never keep the resolver from registering
        log.warning("loragate: vLLM's InputBatch not found; batches are left as vLLM builds them")
        return
    original = getattr(InputBatch, "make_lora_inputs", None)
    if original is None or getattr(original, "loragate", False):
        return

    def make_lora_inputs(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        prompt_mapping, token_mapping, _by_name = original(self, *args, **kwargs)
        return prompt_mapping, token_mapping, list(self.lora_id_to_lora_request.values())

    make_lora_inputs.loragate = True  # type: ignore[attr-defined]
    InputBatch.make_lora_inputs = make_lora_inputs


def pins_off_the_gpu() -> bool:
    """Whether this process's vLLM pins adapters in the CPU cache only (``engine_cache`` pins
    nothing otherwise). Every process of a replica runs the same plugin over the same vLLM,
    so the API server's answer is the worker's."""
    return _pins_off_the_gpu


def pin_in_the_cpu_cache_only() -> None:
    """Pin an adapter in the engine's CPU cache, never in a GPU slot.

    vLLM 0.32's ``pin_lora`` pins an adapter in the registered (CPU) cache,
    ``--max-cpu-loras``, where it is never evicted and so never read from disk again -- the
    residency loragate wants -- and in a GPU slot (``--max-loras``) too. The scheduler still
    admits ``max_loras`` distinct adapters to a batch whatever is pinned: with one slot
    pinned, a batch of ``max_loras`` other adapters evicts one of its own while activating
    the next, and the mapping names an id with no slot (the engine dies, as in
    ``keep_each_adapter_of_a_batch``); with every slot pinned, activating any other adapter
    raises. Activating a registered adapter is a copy in memory; the GPU half of the pin is
    left out.
    """
    global _pins_off_the_gpu
    try:
        from vllm.lora.model_manager import LRUCacheLoRAModelManager
    except Exception:  # another vLLM, or none: patch nothing, pin nothing
        log.warning("loragate: vLLM's LRUCacheLoRAModelManager not found; adapters are not pinned")
        return
    original = getattr(LRUCacheLoRAModelManager, "pin_adapter", None)
    if original is not None and getattr(original, "loragate", False):
        _pins_off_the_gpu = True
        return
    if original is None or not hasattr(LRUCacheLoRAModelManager, "_pin_lora_in_cpu_cache"):
        log.warning("loragate: vLLM's pin_adapter is not the one loragate knows; adapters are not pinned")
        return

    def pin_adapter(self, lora_id: int) -> bool:  # type: ignore[no-untyped-def]
        self._pin_lora_in_cpu_cache(lora_id)  # raises for an id not registered, as vLLM's does
        return True

    pin_adapter.loragate = True  # type: ignore[attr-defined]
    LRUCacheLoRAModelManager.pin_adapter = pin_adapter
    _pins_off_the_gpu = True


def close_the_unload_window(adapter_dir: str, role: str, expect: Expectations | None = None) -> None:
    """Answer from the index a request whose adapter was unloaded after it was admitted.

    vLLM 0.32 checks a request's adapter name (``_check_model``, where resolvers are asked)
    and looks its LoRA request up again after rendering the prompt
    (``_maybe_get_adapters``, where they are not). A switch's unload landing between the
    two turns the request into a 404 -- measured: 1 request in ~8 switches under load. This
    wraps the second lookup so that a name the index names is served from the index's
    path, as the resolver would have served it a moment later. One LoRA request per (name,
    path) is reused, so the engine loads each version once. Applied only to the vLLM it was
    written for: if the method is not there, nothing is patched and the window stays open.
    ``expect``: what the registry expects (default: its database, asked each time).
    """
    try:
        from vllm.entrypoints.serve.engine.serving import BaseServing
        from vllm.lora.request import LoRARequest
    except Exception:  # another vLLM: patch nothing
        log.warning("loragate: vLLM's BaseServing not found; the unload window stays open")
        return
    original = getattr(BaseServing, "_maybe_get_adapters", None)
    if original is None or getattr(original, "loragate", False):
        return
    admitted: dict[tuple[str, str], LoRARequest] = {}

    def _maybe_get_adapters(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = getattr(request, "model", None)
        models = getattr(self, "models", None)
        if (
            isinstance(name, str)
            and qualified.allowed(name)
            and models is not None
            and name not in models.lora_requests
            and not self._is_model_supported(name)
        ):
            try:
                found = lookup(adapter_dir, role, name, expect)
            except Exception:
                log.exception("loragate: index lookup failed for %s", name)
                found = None
            if found is not None:
                key = (name, found[1])
                if key not in admitted:
                    if len(admitted) >= 1024:  # one per version switched to; keep it bounded
                        admitted.clear()
                    admitted[key] = LoRARequest(
                        lora_name=name, lora_int_id=models.lora_id_counter.inc(1), lora_path=found[1]
                    )
                    log.info("loragate: %s unloaded after admission, served from %s", name, found[1])
                return admitted[key]
        return original(self, request, *args, **kwargs)

    _maybe_get_adapters.loragate = True  # type: ignore[attr-defined]
    BaseServing._maybe_get_adapters = _maybe_get_adapters
