"""HttpSearchTool (a client of an HTTP search service) against a real local http.server."""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from agentflow.tools.base import ToolSpec
from agentflow.tools.http_tools import HttpSearchTool, HttpToolConfig

SPEC = ToolSpec(name="retriever", description="Searches a passage service.", input_format="a short query")
ENV = "AGENTFLOW_TEST_RETRIEVER_URL"

RESULTS = {"results": [
    {"title": "Lisbon", "snippet": "Lisbon is the capital of Portugal.", "url": "https://example.org/lisbon"},
    {"title": "Porto", "text": "Porto is a city in northern Portugal."},
    {"title": "Tagus", "snippet": "The Tagus flows through Lisbon."},
]}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        self.server.queries.append(parse_qs(url.query))
        route = {"/ok": (200, json.dumps(RESULTS)), "/fail": (500, "boom"), "/missing": (404, "no"),
                 "/notjson": (200, "<html>"), "/badshape": (200, json.dumps({"items": []})),
                 "/badresult": (200, json.dumps({"results": [{"url": "x"}]})),
                 "/empty": (200, json.dumps({"results": []}))}
        if url.path == "/slow":
            time.sleep(1.5)
            route[url.path] = (200, json.dumps(RESULTS))
        status, body = route.get(url.path, (404, ""))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.queries = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd
    httpd.shutdown()
    httpd.server_close()


def tool_for(url, **settings):
    return HttpSearchTool(SPEC, ENV, HttpToolConfig(endpoint=url, **settings))


def test_success_formats_top_k_results(server):
    base, httpd = server
    result = tool_for(base + "/ok", top_k=2).run("capital of Portugal", timeout=5)
    assert result.ok, result.error
    assert result.output.startswith("[1] Lisbon\nLisbon is the capital of Portugal.\n(https://example.org/lisbon)")
    assert "[2] Porto\nPorto is a city" in result.output and "Tagus" not in result.output
    assert httpd.queries[-1] == {"q": ["capital of Portugal"], "limit": ["2"]}


def test_no_results_is_not_an_error(server):
    result = tool_for(server[0] + "/empty").run("nothing", timeout=5)
    assert result.ok and "No results" in result.output


def test_server_error_is_unavailable(server):
    assert tool_for(server[0] + "/fail").run("q", timeout=5).error.startswith("unavailable:")


@pytest.mark.parametrize("path", ["/missing", "/notjson", "/badshape", "/badresult"])
def test_unexpected_answers_are_bad_responses(server, path):
    assert tool_for(server[0] + path).run("q", timeout=5).error.startswith("bad_response:")


def test_slow_server_times_out_within_the_smaller_timeout(server):
    started = time.monotonic()
    result = tool_for(server[0] + "/slow", timeout_s=10).run("q", timeout=0.3)
    assert result.error.startswith("timeout:")
    assert time.monotonic() - started < 1.0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_port_is_unavailable_after_one_retry(monkeypatch):
    calls = []
    real_get = httpx.get
    monkeypatch.setattr(httpx, "get", lambda *a, **k: calls.append(a) or real_get(*a, **k))
    result = tool_for(f"http://127.0.0.1:{_closed_port()}/search").run("q", timeout=5)
    assert result.error.startswith("unavailable:")
    assert len(calls) == 2


def test_no_endpoint_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    result = HttpSearchTool(SPEC, ENV).run("q", timeout=5)
    assert result.error.startswith("unavailable:") and ENV in result.error


def test_endpoint_from_the_environment_is_read_when_built(server, monkeypatch):
    monkeypatch.setenv(ENV, server[0] + "/ok")
    tool = HttpSearchTool(SPEC, ENV)
    monkeypatch.setenv(ENV, server[0] + "/fail")
    assert tool.run("Lisbon", timeout=5).ok


def test_empty_query_is_an_error(server):
    assert tool_for(server[0] + "/ok").run("  ", timeout=5).error.startswith("invalid_input:")
