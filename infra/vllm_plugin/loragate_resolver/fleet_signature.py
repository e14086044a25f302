"""Whether a request is the fleet's: signed with the replica's admin key, or carrying it.

The fleet signs its requests (``loragate/tasks/replica_signatures.py``, the same scheme):
``X-Loragate-Signature: v1 t=<unix s> n=<nonce> s=<hex HMAC-SHA256>`` over the method, the
raw path and query, the time, the nonce and the body's digest, under a key derived from
``admin-key`` in the replica's secrets directory (re-read per request: a rotated key takes
effect). Taken when the time is within ``SKEW_S`` of this clock and the nonce was not seen
in that time: a proxy that saw a signed request can neither alter it nor send it again. The
key itself in ``X-Loragate-Admin-Key`` is still taken (an operator's shell, the tests); the
fleet never sends it.

The outermost of loragate's middlewares that asks decides once per request and leaves the
answer in the ASGI scope (a nonce is taken once, and the body is read once and replayed).
An answer to a signed request is signed back (``answer_headers``): HMAC over the nonce,
the status and the body's digest, so the fleet knows figures came from a key holder.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections import OrderedDict
from typing import Any

from loragate_resolver import registry_reader

KEY_HEADER = b"x-loragate-admin-key"
SIGNATURE_HEADER = b"x-loragate-signature"
ANSWER_SIGNATURE_HEADER = b"x-loragate-answer-signature"
SKEW_S = 60.0
MAX_SIGNED_BODY_BYTES = 4 * 1024 * 1024
NONCES_KEPT = 1 << 16
_DECIDED = "loragate.fleet"  # scope key: one of the verdicts below
_NONCE = "loragate.fleet_nonce"
FLEET, NO_CREDENTIAL, WRONG, CLOSED = "fleet", "none", "wrong", "closed"

_seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when taken, oldest first


def signing_key(admin_key: str) -> bytes:
    return hashlib.sha256(b"loragate-replica-signing\0" + admin_key.encode()).digest()


def header(scope: dict, name: bytes) -> bytes | None:
    return next((value for key, value in scope.get("headers", []) if key.lower() == name), None)


def key_matches(presented: bytes | None, expected: str) -> bool:
    """Constant time in the key's content (both sides hashed first: equal lengths)."""
    if presented is None:
        return False
    return hmac.compare_digest(hashlib.sha256(presented).digest(), hashlib.sha256(expected.encode()).digest())


def _parsed(value: bytes) -> tuple[int, str, str] | None:
    try:
        scheme, *fields = value.decode("ascii").split()
        found = dict(f.split("=", 1) for f in fields)
        if scheme != "v1":
            return None
        return int(found["t"]), found["n"], found["s"]
    except (ValueError, KeyError, UnicodeDecodeError):
        return None


def _fresh_nonce(nonce: str, now: float) -> bool:
    while _seen and now - next(iter(_seen.values())) > 2 * SKEW_S:
        _seen.popitem(last=False)
    if nonce in _seen or not 16 <= len(nonce) <= 64:
        return False
    _seen[nonce] = now
    while len(_seen) > NONCES_KEPT:
        _seen.popitem(last=False)
    return True


def raw_target(scope: dict) -> bytes:
    """The path and query as the client sent them (what it signed)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return raw + (b"?" + query if query else b"")


def verdict(scope: dict) -> str | None:
    """What ``decide`` found for this request, or None when nothing has asked yet."""
    return scope.get(_DECIDED)


async def decide(scope: dict, receive: Any, secrets_dir: str | None, clock: Any = time.time) -> tuple[str, Any]:
    """(verdict, the ``receive`` to hand on): ``FLEET``, ``NO_CREDENTIAL``, ``WRONG`` (a key or
    signature that is not this fleet's, or a replay) or ``CLOSED`` (this replica has no key)."""
    decided = scope.get(_DECIDED)
    if decided is not None:
        return decided, receive
    presented_key, signature = header(scope, KEY_HEADER), header(scope, SIGNATURE_HEADER)
    if presented_key is None and signature is None:
        found = NO_CREDENTIAL
    else:
        expected = registry_reader.read_secret(secrets_dir, registry_reader.ADMIN_KEY_FILE)
        if expected is None:
            found = CLOSED
        elif presented_key is not None:
            found = FLEET if key_matches(presented_key, expected) else WRONG
        else:
            assert signature is not None
            if scope["type"] != "http":
                found = WRONG  # the fleet signs no websocket
            else:
                body, too_large = await read_body(receive, MAX_SIGNED_BODY_BYTES)
                receive = replay(body, receive)
                found = WRONG if too_large else _check_signature(scope, signature, body, expected, clock())
    scope[_DECIDED] = found
    return found, receive


def _check_signature(scope: dict, signature: bytes, body: bytes, admin_key: str, now: float) -> str:
    parsed = _parsed(signature)
    if parsed is None:
        return WRONG
    at, nonce, mac = parsed
    message = b"\n".join(
        [
            b"request",
            (scope.get("method") or "").upper().encode(),
            raw_target(scope),
            str(at).encode(),
            nonce.encode(),
            hashlib.sha256(body).hexdigest().encode(),
        ]
    )
    expected = hmac.new(signing_key(admin_key), message, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), mac.encode()) or abs(now - at) > SKEW_S:
        return WRONG
    if not _fresh_nonce(nonce, now):
        return WRONG
    scope[_NONCE] = nonce
    return FLEET


def answer_headers(scope: dict, status: int, body: bytes, secrets_dir: str | None) -> list[tuple[bytes, bytes]]:
    """The answer's signature for a signed request of the fleet's (none for any other)."""
    nonce = scope.get(_NONCE)
    admin_key = registry_reader.read_secret(secrets_dir, registry_reader.ADMIN_KEY_FILE) if nonce else None
    if nonce is None or admin_key is None:
        return []
    message = b"\n".join([b"answer", nonce.encode(), str(status).encode(), hashlib.sha256(body).hexdigest().encode()])
    return [(ANSWER_SIGNATURE_HEADER, hmac.new(signing_key(admin_key), message, hashlib.sha256).hexdigest().encode())]


async def read_body(receive: Any, limit: int) -> tuple[bytes, bool]:
    """The request's body, or (b"", True) once it passes ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks), False


def replay(body: bytes, original: Any) -> Any:
    """A ``receive`` that hands the app the body already read, then what the server sends."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await original()

    return receive
