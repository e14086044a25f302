"""Sealed request ids: an answer's id tells a replica of the fleet which adapter, version and
window gave it, and tells the client nothing but the adapter it asked for.

``<adapter>.<sealed>``, both URL-safe base64 (unpadded): the adapter's name (readable, so
feedback can be sent to a replica of its base), and ``nonce (12 bytes) || ciphertext || tag
(16 bytes)``. The ciphertext is compact JSON ``{"v": version, "w": window id or null,
"t": issued at (unix seconds)}`` XORed with a keystream of HMAC-SHA256 blocks over the
nonce and a counter; the tag is HMAC-SHA256 over the adapter part, the nonce and the
ciphertext -- encrypt-then-MAC with keys derived from the fleet's *feedback key*
(``feedback-key`` in the replicas' secrets), which only the replicas hold: not the admin key
the fleet-control pools hold too. So nobody without it can mint, alter or read an id, and
the window (which once let a client compute its own bucket) is not in sight.

An id is good for ``ttl_s`` after it was issued; the nonce is its identity, by which feedback
is counted once across every replica (``live_stats``). Standard library only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass

NONCE_BYTES = 12
TAG_BYTES = 16
_BLOCK = hashlib.sha256().digest_size


@dataclass(frozen=True)
class RequestId:
    adapter: str
    version: str
    window: int | None
    nonce: str  # hex; the id's identity
    issued_at: float


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _subkey(key: str, purpose: bytes) -> bytes:
    return hmac.new(key.encode(), b"loragate request id: " + purpose, hashlib.sha256).digest()


def _keystream(key: str, nonce: bytes, length: int) -> bytes:
    enc = _subkey(key, b"encrypt")
    blocks = (hmac.new(enc, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(-(-length // _BLOCK)))
    return b"".join(blocks)[:length]


def _tag(key: str, adapter_part: str, sealed: bytes) -> bytes:
    return hmac.new(_subkey(key, b"mac"), adapter_part.encode() + b"." + sealed, hashlib.sha256).digest()[:TAG_BYTES]


def sign(key: str, adapter: str, version: str, window: int | None, now: float | None = None) -> str:
    """A fresh id for an answer of ``version`` of ``adapter`` in ``window``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    issued = int(time.time() if now is None else now)
    plain = json.dumps({"v": version, "w": window, "t": issued}, separators=(",", ":")).encode()
    cipher = bytes(a ^ b for a, b in zip(plain, _keystream(key, nonce, len(plain)), strict=True))
    adapter_part = _b64(adapter.encode())
    sealed = nonce + cipher
    return f"{adapter_part}.{_b64(sealed + _tag(key, adapter_part, sealed))}"


def adapter_of(request_id: object) -> str | None:
    """The adapter an id names (readable by anyone; nothing else is)."""
    if not isinstance(request_id, str) or request_id.count(".") != 1:
        return None
    try:
        return _unb64(request_id.split(".")[0]).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def verify(key: str | None, request_id: object) -> RequestId | None:
    """The id's content when the key sealed it; None for anything else (expiry is the
    caller's: ``expired``)."""
    if not key or not isinstance(request_id, str) or request_id.count(".") != 1:
        return None
    adapter_part, sealed_part = request_id.split(".")
    try:
        sealed = _unb64(sealed_part)
        adapter = _unb64(adapter_part).decode()
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None
    if len(sealed) < NONCE_BYTES + TAG_BYTES + 2:
        return None
    body, tag = sealed[:-TAG_BYTES], sealed[-TAG_BYTES:]
    if not hmac.compare_digest(_tag(key, adapter_part, body), tag):
        return None
    nonce, cipher = body[:NONCE_BYTES], body[NONCE_BYTES:]
    plain = bytes(a ^ b for a, b in zip(cipher, _keystream(key, nonce, len(cipher)), strict=True))
    try:
        content = json.loads(plain)
    except ValueError:
        return None
    if not isinstance(content, dict):
        return None
    version, window, issued = content.get("v"), content.get("w"), content.get("t")
    if not isinstance(version, str) or not isinstance(issued, int):
        return None
    if window is not None and not isinstance(window, int):
        return None
    return RequestId(adapter, version, window, nonce.hex(), float(issued))


def expired(found: RequestId, ttl_s: float, now: float | None = None) -> bool:
    """Older than ``ttl_s``, or issued in the future (a clock no client sets: the replicas')."""
    age = (time.time() if now is None else now) - found.issued_at
    return age > ttl_s or age < -60
