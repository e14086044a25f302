"""A client for one vLLM replica's OpenAI-compatible server and its runtime LoRA API.

Explicit timeouts on every call; retries only for what is idempotent (reading
``/v1/models``, health). vLLM's error envelope ``{"error": {message, type, param, code}}``
becomes a typed error chosen by HTTP status and error ``type``, never by message text:
a transport failure or a 5xx is ``replica_unavailable`` (worth another try or another
replica), 404 ``NotFoundError`` is ``replica_unknown_adapter``, anything else refused is
``replica_refused``. Success bodies of load and unload are plain text.

An idempotent request that fails with ``replica_unavailable`` is tried again, ``retries``
times, after 0.2 s, 0.4 s, ... (``loragate.registry.retrying``); the last failure is raised as it was.

The replica's admin API (load, unload, the live figures, the routing refresh) obeys only
the fleet: those calls are signed with the fleet's admin key (``admin_key``), never sent
with it (``replica_signatures``: a proxy at a registered URL learns nothing it can replay),
and loragate's plugin checks the signature
(``infra/vllm_plugin/loragate_resolver/admin_guard.py``); a replica refuses them without it
(401, ``replica_refused``). The live figures must come back signed by a holder of the key
(``replica_unverified`` otherwise). Inference is signed only when the fleet asks as the fleet
(``admin=True``: golden verification, canary probes): the replica's traffic split then
passes the request through as named -- never split, counted as a user's, or faulted. The
reads that name tenants (``/v1/models``, ``/metrics``) carry it too: without it a replica
answers them less every adapter and version.

Each attempt also has a total deadline, from connecting to its last byte: httpx's timeouts
count per read, so a replica that drips a byte a second would hold the caller (and the
adapter's lock, during a switch) for as long as it likes. The body is read in chunks and
the attempt fails as ``replica_unavailable`` once the deadline has passed; no single read
waits longer than the deadline either.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx

from loragate.registry.errors import ErrorCode, PermissionDenied, ReplicaError
from loragate.registry.retrying import tolerating_unavailable_replicas
from loragate.registry.settings import Settings, env_var
from loragate.tasks.replica_signatures import (
    ANSWER_SIGNATURE_HEADER,
    SIGNATURE_HEADER,
    answer_signed,
    sign_request,
    signing_key,
)
from loragate.tasks.secret_files import ADMIN_KEY_FILE, HOME_REPLICA_SECRETS_DIR, REPLICA_ADMIN_KEY_FILE

if TYPE_CHECKING:
    from loragate.registry.service import Registry

DEFAULT_TIMEOUT = httpx.Timeout(connect=3.0, read=60.0, write=10.0, pool=5.0)
DEFAULT_DEADLINE_S = 120.0
# linear back-off between attempts: 0.2 s, 0.4 s, ...
RETRY_STEP_S = 0.2
ADMIN_KEY_HEADER = "X-Loragate-Admin-Key"


def _capped(timeout: httpx.Timeout, seconds: float) -> httpx.Timeout:
    """``timeout`` with none of its waits longer than ``seconds`` (None, no limit, too)."""
    return httpx.Timeout(
        connect=min(timeout.connect or seconds, seconds),
        read=min(timeout.read or seconds, seconds),
        write=min(timeout.write or seconds, seconds),
        pool=min(timeout.pool or seconds, seconds),
    )


def replica_admin_key(settings: Settings) -> str | None:
    """The fleet's replica admin key. A pool's worker: the one in its secrets directory
    (``replica-admin-key``: only the pools that switch replicas hold one), or none. A
    developer's shell: the file ``replica_admin_key_file`` names, else the one ``loragate
    replicas up`` made under ``home``; None when neither.

    Raises:
        PermissionDenied: MISSING_CREDENTIAL, the file is set but cannot be read or is empty.
    """
    from loragate.tasks.credentials import read_secret, secrets_dir

    if secrets_dir() is not None:  # a pool's worker: its own directory's key or none
        return read_secret(REPLICA_ADMIN_KEY_FILE)
    path = settings.replica_admin_key_file
    if path is None:
        made = Path(settings.home) / HOME_REPLICA_SECRETS_DIR / ADMIN_KEY_FILE
        if not made.is_file():
            return None
        path = made
    try:
        key = Path(path).read_text().strip()
    except OSError as e:
        raise PermissionDenied(
            f"the replica admin key file cannot be read: {type(e).__name__}",
            code=ErrorCode.MISSING_CREDENTIAL,
            field=env_var("replica_admin_key_file"),
        ) from e
    if not key:
        raise PermissionDenied(
            "the replica admin key file is empty",
            code=ErrorCode.MISSING_CREDENTIAL,
            field=env_var("replica_admin_key_file"),
        )
    return key


@dataclass(frozen=True)
class ServedModel:
    id: str
    root: str | None
    parent: str | None


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: list[int] | None
    seconds: float
    # what the replica's traffic split says answered (``x-loragate-version``: a version id,
    # or ``base``) and why not the version chosen (``x-loragate-fallback``); None without
    version: str | None = None
    fallback: str | None = None
    request_id: str | None = None


class ReplicaClient:
    def __init__(
        self,
        url: str,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        retries: int = 2,
        transport: httpx.BaseTransport | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
        admin_key: str | None = None,
    ):
        self.url = url.rstrip("/")
        # what the fleet's requests are signed with; the key itself is never sent or printed
        self._signing_key = signing_key(admin_key) if admin_key else None
        self.retries = retries
        self.deadline_s = deadline_s
        # ``transport``: tests answer from a function instead of a server
        self._http = httpx.Client(base_url=self.url, timeout=_capped(timeout, deadline_s), transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ReplicaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        idempotent: bool,
        admin: bool = False,
    ) -> httpx.Response:
        """One request, tried again on ``replica_unavailable`` when it is idempotent; with
        the admin key when ``admin``."""
        attempts = 1 + (self.retries if idempotent else 0)
        retrying = tolerating_unavailable_replicas(attempts, step_s=RETRY_STEP_S)
        return retrying(lambda: self._send_once(method, path, body, admin))

    def _send_once(self, method: str, path: str, body: dict[str, Any] | None, admin: bool = False) -> httpx.Response:
        """One attempt; signed afresh (its own time and nonce) when ``admin``. The nonce is in
        the response's ``extensions["loragate_nonce"]`` (``_signed_answer`` checks it)."""
        ends_at = time.monotonic() + self.deadline_s
        content = json.dumps(body).encode() if body is not None else None
        request = self._http.build_request(
            method, path, content=content, headers={"content-type": "application/json"} if content else None
        )
        nonce = None
        if admin and self._signing_key is not None:
            request.headers[SIGNATURE_HEADER], nonce = sign_request(
                self._signing_key, method, request.url.raw_path, content or b""
            )
        try:
            streamed = self._http.send(request, stream=True)
            with contextlib.closing(streamed):
                chunks = []
                for chunk in streamed.iter_bytes():
                    chunks.append(chunk)
                    if time.monotonic() > ends_at:
                        raise ReplicaError(
                            f"replica {self.url} did not finish answering {method} {path} within "
                            f"{self.deadline_s:g} s (LORAGATE_REPLICA_REQUEST_DEADLINE_S)",
                            code=ErrorCode.REPLICA_UNAVAILABLE,
                            field="url",
                        )
            # the decoded body, so without the header saying how it was encoded
            headers = [(k, v) for k, v in streamed.headers.multi_items() if k.lower() != "content-encoding"]
            response = httpx.Response(
                streamed.status_code,
                headers=headers,
                content=b"".join(chunks),
                request=streamed.request,
                extensions={"loragate_nonce": nonce},
            )
        except httpx.TransportError as e:  # refused, reset, timed out
            raise ReplicaError(
                f"replica {self.url} unreachable on {method} {path}: {type(e).__name__}",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="url",
            ) from e
        if response.status_code >= 400:
            raise self._error(method, path, response)
        return response

    def _error(self, method: str, path: str, response: httpx.Response) -> ReplicaError:
        kind = "?"
        try:
            envelope = response.json().get("error", {})
            kind = str(envelope.get("type", "?"))
            detail = str(envelope.get("message", ""))[:300]
        except (ValueError, AttributeError):
            detail = response.text[:300]
        status = response.status_code
        if status >= 500:
            code = ErrorCode.REPLICA_UNAVAILABLE
        elif status == 404 and kind == "NotFoundError":
            code = ErrorCode.REPLICA_UNKNOWN_ADAPTER
        else:
            code = ErrorCode.REPLICA_REFUSED
        return ReplicaError(
            f"replica {self.url} answered {status} {kind} to {method} {path}: {detail}",
            code=code,
            field="url",
            status=status,
        )

    # -- the API --------------------------------------------------------------

    def health(self) -> bool:
        try:
            return self._send("GET", "/health", idempotent=True).status_code == 200
        except ReplicaError:
            return False

    def models(self) -> list[ServedModel]:
        # with the key: a keyless read lists the base alone (the plugin's keyless_reads)
        data = self._send("GET", "/v1/models", idempotent=True, admin=True).json().get("data", [])
        return [ServedModel(m["id"], m.get("root"), m.get("parent")) for m in data]

    def served_adapters(self) -> dict[str, str]:
        """Adapter name -> the path it is served from (the base's own card is left out)."""
        return {m.id: m.root for m in self.models() if m.parent is not None and m.root is not None}

    def load(self, name: str, path: str, *, inplace: bool = False) -> None:
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if inplace:
            body["load_inplace"] = True
        self._send("POST", "/v1/load_lora_adapter", body, idempotent=False, admin=True)

    def unload(self, name: str) -> bool:
        """True when it was served; an adapter the replica does not know is not an error."""
        try:
            self._send("POST", "/v1/unload_lora_adapter", {"lora_name": name}, idempotent=False, admin=True)
        except ReplicaError as e:
            if e.code == ErrorCode.REPLICA_UNKNOWN_ADAPTER:
                return False
            raise
        return True

    def complete(
        self,
        model: str,
        prompt: str,
        max_tokens: int,
        *,
        admin: bool = False,
        user: str | None = None,
        exact_tokens: bool = False,
    ) -> Completion:
        """Greedy completion of ``prompt`` by ``model`` (the base or an adapter name), as a
        user (``user``: the end user the split keys on) or as the fleet (``admin``).
        ``exact_tokens``: exactly ``max_tokens`` generated, its end of text ignored until then
        (vLLM's ``min_tokens``) -- a probe's reference doing the same work as the answer it
        is compared with."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
        }
        if exact_tokens:
            body["min_tokens"] = max_tokens
        if user is not None:
            body["user"] = user
        started = time.perf_counter()
        response = self._send("POST", "/v1/completions", body, idempotent=False, admin=admin)
        choice = response.json()["choices"][0]
        return Completion(
            choice["text"],
            choice.get("token_ids"),
            time.perf_counter() - started,
            version=response.headers.get("x-loragate-version"),
            fallback=response.headers.get("x-loragate-fallback"),
            request_id=response.headers.get("x-loragate-request-id"),
        )

    def complete_many(self, model: str, prompts: list[str], max_tokens: int, *, admin: bool = False) -> list[str]:
        """Greedy completions of several prompts in one request: the replica batches them,
        so they cost about as much as one."""
        if not prompts:
            return []
        response = self._send(
            "POST",
            "/v1/completions",
            {"model": model, "prompt": prompts, "max_tokens": max_tokens, "temperature": 0},
            idempotent=False,
            admin=admin,
        )
        texts = [""] * len(prompts)
        for choice in response.json()["choices"]:
            texts[choice["index"]] = choice["text"]
        return texts

    # -- the traffic split (loragate's plugin) --------------------------------

    def traffic(self, adapters: list[str] | None = None, *, alerts_only: bool = False) -> dict[str, Any]:
        """The replica's live figures per adapter version and window, its breaker trips and
        its recent fallback rates (``GET /loragate/traffic``, the fleet's key): only
        ``adapters``' when given, and no per-version figures when ``alerts_only``."""
        query = [("adapter", name) for name in adapters or []] + ([("view", "alerts")] if alerts_only else [])
        path = "/loragate/traffic" + (f"?{urlencode(query)}" if query else "")
        data = self._signed_answer(self._send("GET", path, idempotent=True, admin=True), path).json()
        return data if isinstance(data, dict) else {}

    def _signed_answer(self, response: httpx.Response, path: str) -> httpx.Response:
        """``response`` when the replica signed it as the answer to the request sent: figures
        that decide a verdict come from a holder of the fleet's key, not a proxy's invention."""
        nonce = response.extensions.get("loragate_nonce")
        presented = response.headers.get(ANSWER_SIGNATURE_HEADER)
        if (
            self._signing_key is None
            or not nonce
            or not answer_signed(self._signing_key, nonce, response.status_code, response.content, presented)
        ):
            raise ReplicaError(
                f"replica {self.url} answered {path} without the signature of the fleet's key: not taken",
                code=ErrorCode.REPLICA_UNVERIFIED,
                field="url",
            )
        return response

    def refresh_routes(self) -> dict[str, Any]:
        """Make the replica read the registry's routing table now, not at its next refresh;
        returns the table it read."""
        data = self._send("POST", "/loragate/routes", {}, idempotent=True, admin=True).json()
        return data if isinstance(data, dict) else {}

    def feedback(self, request_id: str, outcome: str) -> dict[str, Any]:
        """Tell the replica whether the user accepted the answer with ``request_id`` or asked
        again (``accepted`` / ``retried``); counted once."""
        body = {"request_id": request_id, "outcome": outcome}
        data = self._send("POST", "/loragate/feedback", body, idempotent=False).json()
        return data if isinstance(data, dict) else {}

    def metric(self, name: str) -> float:
        """The sum of one Prometheus counter over its label sets (e.g. prefix-cache hits)."""
        text = self._send("GET", "/metrics", idempotent=True, admin=True).text  # keyless: no tenant's samples
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rsplit(" ", 1)[1])
        return total


def replica_client(registry: Registry, url: str, retries: int = 2) -> ReplicaClient:
    """A client with the timeouts the settings give and the fleet's admin key, when this
    process holds one (without it a replica refuses loads and unloads)."""
    s = registry.settings
    timeout = httpx.Timeout(
        connect=s.replica_connect_timeout_s, read=s.replica_read_timeout_s, write=s.replica_read_timeout_s, pool=5.0
    )
    return ReplicaClient(
        url, timeout=timeout, retries=retries, deadline_s=s.replica_request_deadline_s, admin_key=replica_admin_key(s)
    )
