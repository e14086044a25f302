"""A pass-through HTTP proxy in front of a replica that answers one adapter slower.

bench/scale.py's slow control tenant needs a canary that is really slower *to the probes*:
the replicas' injected faults (``LORAGATE_REPLICA_FAULTS``) delay only client requests, never
the fleet's admin-keyed probes, and a dark canary (an adapter's first version) has no client
requests at all; a bigger adapter is no answer either (the replicas cap the LoRA rank at 16,
and on the tiny base a rank-16 adapter costs about what a rank-8 one does). So the replica is
registered behind this proxy, which forwards every request as it came and holds the answer
to a completion that names a slowed adapter (``name`` or ``name@version``) until it has taken
``factor`` times what the replica took (at least ``floor_ms`` more): to the fleet that adapter
simply computes slower. A fixed delay would not do: on a loaded host one answer takes 100 ms
or 3 s, and a fixed 300 ms drowns in that (the smoke run's control went ready with it); a
slower adapter is slower by a factor, loaded or not. Every replica of the burst goes through
a proxy, so the hop's own cost falls on both sides of a comparison alike.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

COMPLETIONS = ("/v1/completions", "/v1/chat/completions")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host"}


class DelayProxy:
    """``with DelayProxy(upstream, {"name": 3.0}) as proxy: proxy.url``: ``name`` answers
    3 times as slowly as the replica does (``floor_ms`` more at least)."""

    def __init__(self, upstream: str, factors: dict[str, float] | None = None, floor_ms: float = 100.0) -> None:
        self.upstream = upstream.rstrip("/")
        self.factors = dict(factors or {})
        self.floor_ms = floor_ms
        self.delayed = 0
        self._client = httpx.Client(base_url=self.upstream, timeout=900)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def factor_for(self, path: str, body: bytes) -> float:
        if path.split("?")[0] not in COMPLETIONS or not self.factors:
            return 1.0
        try:
            model = str(json.loads(body).get("model", ""))
        except (ValueError, AttributeError):
            return 1.0
        return self.factors.get(model.split("@")[0], 1.0)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a probe's connection stays open

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                factor = proxy.factor_for(self.path, body)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                started = time.perf_counter()
                try:
                    answer = proxy._client.request(self.command, self.path, content=body, headers=headers)
                    status, content = answer.status_code, answer.content
                    out = [(k, v) for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP]
                except httpx.HTTPError as e:
                    status, content, out = 502, str(e).encode(), [("content-type", "text/plain")]
                if factor > 1:
                    took = time.perf_counter() - started
                    proxy.delayed += 1
                    time.sleep(max(proxy.floor_ms / 1000, (factor - 1) * took))
                self.send_response(status)
                for k, v in out:
                    self.send_header(k, v)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

            def log_message(self, *_: Any) -> None:
                pass

        return Handler
