"""A small stand-in for `agentflow serve-llm`'s admin API (the contract in agentflow/rollout/backends.py), on a real
HTTP port on 127.0.0.1, for logic tests of the local backend and the controller's process. It keeps the versions
and weights in memory and checks what the contract says the real server checks; it loads no model (a URI in
``bad_uris`` "fails to load") and does not route chat traffic."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeAdmin:
    def __init__(self, *, stable: tuple[str, str] = ("v0", "file:///ckpt/v0"), token: str = ""):
        self.versions: dict[str, dict] = {stable[0]: {"uri": stable[1], "weight": 100}}
        self.bad_uris: set[str] = set()
        self.token = token
        self.inject: list[int] = []  # statuses to answer (once each) before handling the next requests
        self.unload_before_weights: list[str] = []  # idle versions the server unloads just before the next PUT
        self.requests: list[tuple[str, str, object]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, status: int, body) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with fake.lock:
                    fake.requests.append((method, self.path, body))
                    if fake.token and self.headers.get("Authorization") != f"Bearer {fake.token}":
                        return self._reply(401, {"error": "missing or wrong bearer token"})
                    if fake.inject:
                        return self._reply(fake.inject.pop(0), {"error": "injected failure"})
                    status, reply = fake.route(method, self.path, body)
                self._reply(status, reply)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PUT(self):
                self._handle("PUT")

            def do_DELETE(self):
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, body) -> tuple[int, dict]:
        if method == "GET" and path == "/admin/versions":
            return 200, {"versions": [{"name": n, "uri": v["uri"], "weight": v["weight"]}
                                      for n, v in self.versions.items()]}
        if method == "POST" and path == "/admin/versions":
            name, uri = (body or {}).get("name"), (body or {}).get("uri")
            if not name or not uri:
                return 400, {"error": "name and uri are required"}
            if name in self.versions:
                return 409, {"error": f"version {name} exists"}
            if uri in self.bad_uris:
                return 400, {"error": f"cannot load checkpoint {uri}: no config.json"}
            self.versions[name] = {"uri": uri, "weight": 0}
            return 201, {"name": name, "uri": uri, "weight": 0}
        if method == "PUT" and path == "/admin/weights":
            for name in self.unload_before_weights:  # its own unloading, racing the controller's status read
                self.versions.pop(name, None)
            self.unload_before_weights = []
            weights = (body or {}).get("weights") or {}
            unknown = sorted(set(weights) - set(self.versions))
            if unknown:
                return 400, {"error": f"unknown versions {unknown}"}
            if any(not isinstance(w, int) or w < 0 for w in weights.values()) or sum(weights.values()) != 100:
                return 400, {"error": f"weights must be non-negative integers summing to 100: {weights}"}
            for name, version in self.versions.items():
                version["weight"] = weights.get(name, 0)
            return 200, {"weights": {n: v["weight"] for n, v in self.versions.items()}}
        if method == "DELETE" and path.startswith("/admin/versions/"):
            name = path.rsplit("/", 1)[1]
            if name not in self.versions:
                return 404, {"error": f"unknown version {name}"}
            if self.versions[name]["weight"] > 0:
                return 409, {"error": f"version {name} still has weight {self.versions[name]['weight']}"}
            del self.versions[name]
            return 200, {"deleted": name}
        return 404, {"error": f"no route {method} {path}"}

    def weights(self) -> dict[str, int]:
        with self.lock:
            return {n: v["weight"] for n, v in self.versions.items()}

    def __enter__(self) -> FakeAdmin:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
