"""Signed request ids: an answer's id says which adapter, version and window gave it, and any
replica holding the fleet's admin key can check that it gave it.

``<payload>.<sig>``: the payload is URL-safe base64 (unpadded) of compact JSON
``{"a": adapter, "v": version, "w": window id or null, "n": random nonce}``; the signature is
HMAC-SHA256 of the payload's text under the admin key, truncated to 16 bytes, URL-safe base64.
A tenant's feedback (``accepted`` / ``retried``) is believed for the version the id names
because nobody without the key can mint one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

SIG_BYTES = 16


@dataclass(frozen=True)
class RequestId:
    adapter: str
    version: str
    window: int | None
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sig(key: str, payload: str) -> str:
    return _b64(hmac.new(key.encode(), payload.encode(), hashlib.sha256).digest()[:SIG_BYTES])


def sign(key: str, adapter: str, version: str, window: int | None, nonce: str | None = None) -> str:
    body = {"a": adapter, "v": version, "w": window, "n": nonce or secrets.token_urlsafe(12)}
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    return f"{payload}.{_sig(key, payload)}"


def verify(key: str | None, request_id: object) -> RequestId | None:
    """The id's content when its signature is the key's; None for anything else."""
    if not key or not isinstance(request_id, str) or request_id.count(".") != 1:
        return None
    payload, sig = request_id.split(".")
    if not hmac.compare_digest(_sig(key, payload).encode(), sig.encode()):
        return None
    try:
        body = json.loads(_unb64(payload))
    except (ValueError, binascii.Error):
        return None
    if not isinstance(body, dict):
        return None
    adapter, version, window, nonce = body.get("a"), body.get("v"), body.get("w"), body.get("n")
    if not (isinstance(adapter, str) and isinstance(version, str) and isinstance(nonce, str)):
        return None
    if window is not None and not isinstance(window, int):
        return None
    return RequestId(adapter, version, window, nonce)
