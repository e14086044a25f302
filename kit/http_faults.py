"""HTTP faults for tests and benchmarks: an endpoint that never answers, and a
fault-injecting HTTP proxy in front of a real vLLM replica.

It forwards every request to the replica unless told to misbehave on the call that loads an
adapter -- after the unload went through, the worst moment -- the way a sick replica would:
answer 500 with vLLM's error envelope, accept the connection and never answer, answer a
byte a second and never finish, or be gone
altogether (connection refused); or told to hold completions until released, which stops a
fleet switch inside its verification for as long as a test needs. Everything else --
completions, ``/v1/models`` -- reaches the real replica, so what the fleet switch verifies is
what the replica really serves.
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

import httpx

FAULTY_PATHS = ("/v1/load_lora_adapter",)


@contextmanager
def silent_endpoint() -> Iterator[str]:
    """An HTTP endpoint that accepts every connection and never says a word: a stalled S3,
    a hung replica."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


class Fault(StrEnum):
    NONE = "none"
    ERROR_500 = "error-500"
    HANG = "hang"
    # answers 200, then one byte a second, never finishing: per-read timeouts never fire
    DRIP = "drip"
    DEAD = "dead"
    # completions wait until released: a switch is held in its verification, on purpose
    HOLD_COMPLETIONS = "hold-completions"


class CompletionFault(StrEnum):
    """What the proxy does to one completion (``FaultProxy.next_completions``)."""

    ERROR_500 = "error-500"  # a lost request: 500 with vLLM's envelope, the replica never asked
    GARBLE = "garble"  # the replica's answer, its text replaced: a garbled read


class FaultProxy:
    def __init__(self, target: str):
        self.target = target.rstrip("/")
        self.fault = Fault.NONE
        # faults for the next completions, one each, in order; then completions pass
        self.next_completions: list[CompletionFault] = []
        self._stop = threading.Event()
        self.holding = threading.Event()  # a completion is held now
        self._released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                if self.path in FAULTY_PATHS and proxy.fault == Fault.ERROR_500:
                    envelope = {
                        "error": {"message": "injected", "type": "InternalServerError", "param": None, "code": 500}
                    }
                    self._answer(500, json.dumps(envelope).encode(), "application/json")
                    return
                if self.path in FAULTY_PATHS and proxy.fault == Fault.HANG:
                    while not proxy._stop.is_set():
                        time.sleep(0.1)
                    return
                if self.path in FAULTY_PATHS and proxy.fault == Fault.DRIP:
                    self.send_response(200)
                    self.send_header("content-type", "text/plain")
                    self.send_header("content-length", "100000")
                    self.end_headers()
                    while not proxy._stop.is_set():
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(1.0)
                    return
                if self.path == "/v1/completions" and proxy.fault == Fault.HOLD_COMPLETIONS:
                    proxy.holding.set()
                    proxy._released.wait()
                completions = self.path == "/v1/completions" and proxy.next_completions
                completion_fault = proxy.next_completions.pop(0) if completions else None
                if completion_fault == CompletionFault.ERROR_500:
                    envelope = {"error": {"message": "injected", "type": "InternalServerError", "code": 500}}
                    self._answer(500, json.dumps(envelope).encode(), "application/json")
                    return
                with httpx.Client(timeout=120) as client:
                    upstream = client.request(
                        method,
                        proxy.target + self.path,
                        content=body,
                        headers={
                            "content-type": self.headers.get("content-type", "application/json"),
                            # the fleet's signature (or key) on its requests: a proxy passes it on
                            **{k: v for k, v in self.headers.items() if k.lower().startswith("x-loragate-")},
                        },
                    )
                content = upstream.content
                if completion_fault == CompletionFault.GARBLE and upstream.status_code == 200:
                    answer = upstream.json()
                    answer["choices"][0]["text"] = " garbled read"
                    content = json.dumps(answer).encode()
                signed = [(k, v) for k, v in upstream.headers.items() if k.lower().startswith("x-loragate-")]
                self._answer(upstream.status_code, content, upstream.headers.get("content-type", "text/plain"), signed)

            def _answer(
                self, status: int, body: bytes, content_type: str, extra: list[tuple[str, str]] | None = None
            ) -> None:
                self.send_response(status)
                self.send_header("content-type", content_type)
                for name, value in extra or []:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802 (the stdlib's names)
                self._relay("GET")

            def do_POST(self):  # noqa: N802
                self._relay("POST")

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set(self, fault: Fault) -> None:
        """DEAD stops listening (connection refused); any other fault restarts it on the same port."""
        if fault == Fault.DEAD and self.fault != Fault.DEAD:
            self._server.shutdown()
            self._server.server_close()
        elif fault != Fault.DEAD and self.fault == Fault.DEAD:
            self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._server.RequestHandlerClass)
            self._server.daemon_threads = True
            self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
            self._thread.start()
        self.fault = fault

    def release(self) -> None:
        """Let held completions through, and hold none from now on."""
        self.fault = Fault.NONE
        self._released.set()

    def close(self) -> None:
        self._stop.set()
        self._released.set()
        if self.fault != Fault.DEAD:
            self._server.shutdown()
            self._server.server_close()


def port_is_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0
