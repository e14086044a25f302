"""What a caller without the fleet's key reads of a replica's tenants: nothing.

``/v1/models`` lists every adapter a replica serves (``name`` and warm ``name@version``),
and ``/metrics`` labels vLLM's LoRA gauges and loragate's own families with adapter names
and version ids, per-version counts included: to any client of the port, who runs which
canary, and how it does. The admin guard hands those two reads here when the caller did not
present the key. The answer is the same route's, less every tenant: ``/v1/models`` keeps
only the base model (an entry with no ``parent``), and ``/metrics`` drops each sample whose
labels name an adapter or a version -- by label name (``adapter``, ``version``, vLLM's
``running_lora_adapters`` / ``waiting_lora_adapters``) or by value (an adapter name has two
slashes, ``namespace/base/task``; a version id is ``YYYYMMDD_HHMMSS_hex``). The fleet's own
reads carry the key and see everything.
"""

from __future__ import annotations

import json
import re
from typing import Any

# the reads that name tenants, by path
TENANT_READS = frozenset({"/v1/models", "/metrics"})
TENANT_LABELS = frozenset({"adapter", "version", "running_lora_adapters", "waiting_lora_adapters", "lora_name"})
_VERSION_ID = re.compile(r"\d{8}_\d{6}_[0-9a-f]{6,}")
_ADAPTER_NAME = re.compile(r"[^\s\"/]+/[^\s\"/]+/[^\s\"/]+")
# one label of a Prometheus text sample: name="value" (escaped quotes inside the value)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def names_a_tenant(sample: str) -> bool:
    """Whether one line of Prometheus text is a sample whose labels name an adapter or a version."""
    if sample.startswith("#") or "{" not in sample:
        return False
    labels = sample[sample.index("{") + 1 : sample.rindex("}")] if "}" in sample else sample
    for name, value in _LABEL.findall(labels):
        if value and (name in TENANT_LABELS or _ADAPTER_NAME.search(value) or _VERSION_ID.search(value)):
            return True
    return False


def without_tenants(path: str, body: bytes) -> bytes:
    """``body`` of ``path`` (one of ``TENANT_READS``) less every tenant's name and version."""
    if path == "/metrics":
        lines = body.decode("utf-8", "replace").splitlines(keepends=True)
        return "".join(line for line in lines if not names_a_tenant(line)).encode()
    try:
        listed = json.loads(body)
    except ValueError:
        return b'{"object": "list", "data": []}'
    data = listed.get("data") if isinstance(listed, dict) else None
    if not isinstance(data, list):
        return b'{"object": "list", "data": []}'
    listed["data"] = [m for m in data if isinstance(m, dict) and m.get("parent") is None]
    return json.dumps(listed).encode()


async def serve_without_tenants(app: Any, scope: dict, receive: Any, send: Any, path: str) -> None:
    """Run the read, hold its answer, and send it on less every tenant (a successful answer
    only: an error names none), its length fixed to the new body."""
    started: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def held(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
            return
        if message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return None
        body = b"".join(chunks)
        if started.get("status") == 200:
            body = without_tenants(path, body)
        headers = [(k, v) for k, v in started.get("headers", []) if k.lower() != b"content-length"]
        await send({**started, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    await app(scope, receive, held)
