"""Artifact keys: Prefect allows lowercase letters, digits and dashes only."""

from __future__ import annotations

import re


def artifact_key(kind: str, name: str) -> str:
    return f"{kind}-{re.sub(r'[^a-z0-9-]+', '-', name.lower())}".strip("-")[:200]
