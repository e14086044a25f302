"""loragate's LoRA resolver for vLLM: a replica serves what the registry's pointers say,
from its first request, even after a restart.

vLLM asks resolvers only when a request names an adapter the server does not know (with
runtime LoRA updating on), under a per-name lock, once per name until it is unloaded.
This one reads the index loragate writes atomically into the replica's adapter directory
(``LORAGATE_ADAPTER_DIR``) and answers with the path of the version the index names for
the replica's role (``LORAGATE_REPLICA_ROLE``). It needs no database driver and no
Prefect -- only the index file -- and never raises: an exception inside a resolver becomes
a 500 and skips later resolvers, so anything unexpected is "no adapter" instead.
"""

from __future__ import annotations

import json
import logging
import os

INDEX_FILE = ".loragate-index.json"
INDEX_FORMAT = 1

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


def lookup(adapter_dir: str, role: str, lora_name: str) -> tuple[str, str] | None:
    """(version id, path) the index names for ``lora_name`` on a replica of ``role``, when the
    bundle is there and is the version the entry says."""
    entry = read_index(adapter_dir).get("roles", {}).get(role, {}).get(lora_name)
    if not isinstance(entry, dict):
        return None
    version, path = entry.get("version"), entry.get("path")
    if not (isinstance(version, str) and isinstance(path, str)):
        return None
    # an index entry is only trusted for a bundle inside the adapter directory whose own
    # manifest names the same version
    real_dir, real_path = os.path.realpath(adapter_dir), os.path.realpath(path)
    if os.path.commonpath([real_dir, real_path]) != real_dir:
        return None
    try:
        with open(os.path.join(real_path, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("adapter_version") != version:
        return None
    # the path as loragate wrote it: it is what /v1/models shows as the adapter's root, and
    # what loragate compares against what it expects
    return version, path


def register() -> None:
    """vLLM's general-plugin entry point: register the resolver when the replica is ours."""
    adapter_dir = os.environ.get("LORAGATE_ADAPTER_DIR")
    role = os.environ.get("LORAGATE_REPLICA_ROLE")
    if not adapter_dir or not role:
        return
    from vllm.lora.request import LoRARequest
    from vllm.lora.resolver import LoRAResolver, LoRAResolverRegistry

    class LoragateResolver(LoRAResolver):
        async def resolve_lora(self, base_model_name: str, lora_name: str) -> LoRARequest | None:
            try:
                found = lookup(adapter_dir, role, lora_name)
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
