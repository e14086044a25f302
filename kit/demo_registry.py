"""What the demo reads of its own registry (``.loragate/``, the embedded defaults) to follow
the gates: the adapter it promotes, each version's stage and its canary window."""

from __future__ import annotations

from pathlib import Path

SUPPORT = "acme/tiny-llama/support"


def registry():
    from loragate.registry.service import Registry
    from loragate.registry.settings import Settings

    return Registry.open(Settings())


def version_of(name: str, source: Path) -> str | None:
    """The version registered from ``source`` (its weights digest is in the version id)."""
    from loragate.registry.digests import sha256_file

    digest = sha256_file(source / "adapter_model.safetensors")[:12]
    with registry() as reg:
        found = [v.version_id for v in reg.list_versions() if v.name == name and v.version_id.endswith(digest)]
    return found[0] if found else None


def stage_of(version_id: str) -> tuple[str, str]:
    with registry() as reg:
        v = reg.get_version(version_id)
        return v.stage.value, v.validation_status.value


def window_status(version_id: str) -> tuple[str, int, str | None]:
    from loragate.registry.errors import NotFound

    with registry() as reg:
        try:
            w = reg.latest_canary_window(version_id)
        except NotFound:
            return "none", 0, None
        return w.status.value, len(reg.canary_observations(w.id)), w.approval_flow_run_id
