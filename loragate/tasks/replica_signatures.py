"""The fleet's requests to a replica are signed, never sent with the key; its answers too.

A replica's admin key is what every replica obeys. Sent as a bearer header, it would go to
whatever answers at a registered URL -- a proxy in front of a real replica included, which
could keep and replay it. So the fleet signs instead: ``X-Loragate-Signature`` holds the
time, a fresh nonce and an HMAC-SHA256 over the method, the raw path and query, the time,
the nonce and the body's digest, under a key derived from the admin key. The replica
(``infra/vllm_plugin/loragate_resolver/fleet_signature.py``) takes a signature within
``SKEW_S`` of its clock, once per nonce. A proxy learns one request it can neither alter
nor send again.

What the replica answers to a signed request carries ``X-Loragate-Answer-Signature``: an
HMAC over the request's nonce, the status and the body's digest. The fleet checks it where
an answer decides something -- the live figures a verdict sums: figures nobody holding the
key wrote are refused (``replica_unverified``), so a registered proxy cannot make them up.
The two modules implement one scheme twice (the plugin imports nothing of loragate's);
tests/test_replica_signatures.py holds them to each other.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SIGNATURE_HEADER = "X-Loragate-Signature"
ANSWER_SIGNATURE_HEADER = "X-Loragate-Answer-Signature"
SCHEME = "v1"
SKEW_S = 60.0


def signing_key(admin_key: str) -> bytes:
    """The key both sides sign with: derived, so no signature is an HMAC under the admin key."""
    return hashlib.sha256(b"loragate-replica-signing\0" + admin_key.encode()).digest()


def request_message(method: str, raw_path: bytes, at: int, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest().encode()
    return b"\n".join([b"request", method.upper().encode(), raw_path, str(at).encode(), nonce.encode(), digest])


def answer_message(nonce: str, status: int, body: bytes) -> bytes:
    return b"\n".join([b"answer", nonce.encode(), str(status).encode(), hashlib.sha256(body).hexdigest().encode()])


def sign_request(key: bytes, method: str, raw_path: bytes, body: bytes, at: float | None = None) -> tuple[str, str]:
    """(the header's value, its nonce) for one request; ``raw_path``: path and query as sent."""
    moment = int(time.time() if at is None else at)
    nonce = secrets.token_hex(16)
    mac = hmac.new(key, request_message(method, raw_path, moment, nonce, body), hashlib.sha256).hexdigest()
    return f"{SCHEME} t={moment} n={nonce} s={mac}", nonce


def answer_signed(key: bytes, nonce: str, status: int, body: bytes, presented: str | None) -> bool:
    """Whether ``presented`` is the replica's signature of this answer to the request ``nonce``."""
    if not presented:
        return False
    expected = hmac.new(key, answer_message(nonce, status, body), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), presented.strip().encode())
