"""A plain round-robin HTTP balancer in front of replicas (``bench/traffic.py``): what an
operator's Kubernetes Service or a router that knows nothing of loragate does. Each request
goes to the next upstream in turn, whoever the user; the body and headers pass unchanged
and the answer says which upstream gave it (``x-bench-upstream``), so a user's stickiness
is checked across replicas, not only on one. ``start_at`` sets whose turn is next: a pass
of users asking again starts one upstream over, so their answers come from the other
replica (a pass of an even number of requests would otherwise send each user back where
it went before).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# connection-scoped headers a proxy does not pass on (RFC 9110 section 7.6.1), and the
# length, which it sets itself
_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer", "content-length"}
)
_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=10.0)


@dataclass
class Balancer:
    url: str
    upstreams: int
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def turn(self) -> int:
        with self._lock:
            index, self._next = self._next, (self._next + 1) % self.upstreams
            return index

    def start_at(self, index: int) -> None:
        with self._lock:
            self._next = index % self.upstreams


@contextmanager
def round_robin(upstreams: list[str]) -> Iterator[Balancer]:
    """A balancer on a free local port, alternating between ``upstreams``."""
    balancer = Balancer("", len(upstreams))
    local = threading.local()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive to the clients, as a real balancer

        def _forward(self) -> None:
            index = balancer.turn()
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP and k.lower() != "host"}
            http = getattr(local, "http", None)
            if http is None:
                http = local.http = httpx.Client(timeout=_TIMEOUT)
            try:
                upstream = http.request(self.command, upstreams[index] + self.path, content=body, headers=headers)
                status, payload, answer_headers = upstream.status_code, upstream.content, upstream.headers
            except httpx.HTTPError as e:
                status, payload, answer_headers = 502, str(e).encode(), httpx.Headers()
            self.send_response(status)
            for key, value in answer_headers.multi_items():
                if key.lower() not in _HOP:
                    self.send_header(key, value)
            self.send_header("x-bench-upstream", str(index))
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = _forward
        do_POST = _forward

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the stdlib's name)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        balancer.url = f"http://127.0.0.1:{server.server_address[1]}"
        yield balancer
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
