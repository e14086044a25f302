"""A request to a replica ends within its total deadline (``LORAGATE_REPLICA_REQUEST_DEADLINE_S``),
however the replica misbehaves: one that never answers, one that sends its headers and then
drips its body a byte at a time (httpx's timeouts count per read, so it alone would wait for
as long as the drip lasts). A real HTTP server on a socket plays each replica; the deadline
is short so the test is quick, and the bound asserted leaves room for a loaded machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.tasks.replicas import ReplicaClient

DEADLINE_S = 0.5
STALL_S = 20.0  # how long a bad replica would keep a caller without the deadline


class Misbehaving(BaseHTTPRequestHandler):
    """``/hang...``: reads the request, answers nothing. ``/drip...``: 200 and a
    content-length, then one byte every 0.1 s. Anything else: a well-formed model list."""

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._answer()

    def _answer(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        stop: threading.Event = self.server.stop  # type: ignore[attr-defined]
        if mode == "hang":
            stop.wait(STALL_S)
            return
        body = b'{"data": [{"id": "tiny-llama", "root": "/m", "parent": null}]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body) if mode == "well" else 10_000))
        self.end_headers()
        if mode == "well":
            self.wfile.write(body)
            return
        for _ in range(int(STALL_S * 10)):
            if stop.wait(0.1):
                return
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:  # the client gave up
                return

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replica() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    server.daemon_threads = True
    server.stop = threading.Event()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def client_of(server: ThreadingHTTPServer, mode: str) -> ReplicaClient:
    server.mode = mode  # type: ignore[attr-defined]
    return ReplicaClient(f"http://127.0.0.1:{server.server_address[1]}", retries=0, deadline_s=DEADLINE_S)


@pytest.mark.parametrize(
    "mode, call",
    [
        ("hang", lambda c: c.models()),
        ("drip", lambda c: c.models()),
        ("hang", lambda c: c.load("acme/tiny-llama/support", "/adapters/x")),
        ("drip", lambda c: c.load("acme/tiny-llama/support", "/adapters/x")),
    ],
    ids=["hangs-on-a-read", "drips-a-read", "hangs-on-a-load", "drips-a-load"],
)
def test_a_replica_that_hangs_or_drips_fails_the_request_within_its_deadline(replica, mode, call):
    with client_of(replica, mode) as client:
        started = time.monotonic()
        with pytest.raises(ReplicaError) as failed:
            call(client)
        took = time.monotonic() - started
    assert (failed.value.code, failed.value.field) == (ErrorCode.REPLICA_UNAVAILABLE, "url")
    # well under the STALL_S the replica would keep it, with room for a loaded machine
    assert took < DEADLINE_S * 2 + 3.0, f"{mode}: {took:.2f} s, deadline {DEADLINE_S} s"


def test_a_replica_that_answers_in_time_is_read_whole(replica):
    with client_of(replica, "well") as client:
        assert [m.id for m in client.models()] == ["tiny-llama"]
