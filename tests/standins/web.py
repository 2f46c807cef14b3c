"""Local HTTP stand-ins for the search tools' outside services, shaped after their public API documentation.

* ``MediaWikiStandin(pages)``: the MediaWiki Action API (``/w/api.php``): ``list=search``, ``prop=extracts``
  (TextExtracts, ``explaintext``; like the real one, one whole-article extract per request, the next ones
  with ``excontinue``), ``prop=info&inprop=url``, ``redirects``, ``formatversion=2`` shapes, API errors.
* ``SearxngStandin(results)``: SearXNG's ``/search?q=...&format=json``.
* ``BraveStandin(results, api_key)``: the Brave Search API's ``/res/v1/web/search`` (``X-Subscription-Token``).
* ``PageServer(pages)``: plain web pages, ``{path: (status, content_type, body)}``; for a 3xx status the body
  is the ``Location``.

Each one is a context manager (a ThreadingHTTPServer on 127.0.0.1, port 0, served from a thread), records
every request in ``.requests`` and takes faults from ``.faults``, a list consumed one per request:

* ``"429"``: 429 with ``Retry-After: 0``; any other three-digit code (``"500"``, ``"503"``): that status;
* ``"timeout"``: sleeps ``slow_s`` seconds (default 3) before answering normally;
* ``"oversize"``: a 200 answer of ``oversize_bytes`` (default 4 MiB) of padding in the usual content type;
* ``"reset"``: closes the connection without answering;
* a ``Reply``: that answer, as it is.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, urlparse


@dataclass
class Reply:
    status: int = 200
    content_type: str = "application/json; charset=utf-8"
    body: bytes | str = b""
    headers: dict = field(default_factory=dict)


def json_reply(obj, status: int = 200) -> Reply:
    return Reply(status, "application/json; charset=utf-8", json.dumps(obj))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        self.server.standin._serve(self)

    def log_message(self, *args):
        pass


class _Standin:
    """The shared machinery: a server thread, request log, fault switch."""

    content_type = "application/json; charset=utf-8"

    def __init__(self):
        self.faults: list = []  # str or Reply
        self.requests: list[dict] = []
        self.slow_s = 3.0
        self.oversize_bytes = 4 * 1024 * 1024
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    # lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.standin = self
        threading.Thread(target=self._httpd.serve_forever, daemon=True, name=type(self).__name__).start()

    def stop(self) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def count(self) -> int:
        return len(self.requests)

    # serving
    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlparse(handler.path)
        params = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        with self._lock:
            self.requests.append({"path": url.path, "params": params, "headers": dict(handler.headers)})
            fault = self.faults.pop(0) if self.faults else None
        if fault == "reset":
            handler.close_connection = True
            return
        if fault == "timeout":
            self._stopping.wait(self.slow_s)
        if isinstance(fault, Reply):
            reply = fault
        elif fault not in (None, "timeout"):
            reply = self._fault_reply(fault)
        else:
            reply = self.handle(url.path, params, handler.headers)
        self._write(handler, reply)

    def _fault_reply(self, fault: str) -> Reply:
        if fault == "oversize":
            return Reply(200, self.content_type, self._padding())
        if re.fullmatch(r"\d{3}", fault):
            headers = {"Retry-After": "0"} if fault == "429" else {}
            return Reply(int(fault), "text/plain; charset=utf-8", f"fault {fault}", headers)
        raise ValueError(f"unknown fault {fault!r}")

    def _padding(self) -> bytes:
        if self.content_type.startswith("application/json"):
            return b'{"padding": "' + b"x" * self.oversize_bytes + b'"}'
        return b"<html><body><p>" + b"padding " * (self.oversize_bytes // 8) + b"</p></body></html>"

    @staticmethod
    def _write(handler: BaseHTTPRequestHandler, reply: Reply) -> None:
        body = reply.body.encode() if isinstance(reply.body, str) else reply.body
        try:
            handler.send_response(reply.status)
            handler.send_header("Content-Type", reply.content_type)
            handler.send_header("Content-Length", str(len(body)))
            for name, value in reply.headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            for start in range(0, len(body), 65536):
                handler.wfile.write(body[start:start + 65536])
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout, a size cap)
            handler.close_connection = True

    def handle(self, path: str, params: dict, headers) -> Reply:
        raise NotImplementedError


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


_STOPWORDS = frozenset("a an and are as at be by did do does for from had has have he her his how in is it its of "
                       "on or she that the their this to was were what when where which who whom whose why "
                       "with".split())


def _overlap(query: str, text: str) -> int:
    """How many of the query's distinct content words the text holds (a search engine drops stop words and does
    not favour a page for its length)."""
    wanted = set(_words(query)) - _STOPWORDS
    return len(wanted & set(_words(text)))


def normalise_title(title: str) -> str:
    """MediaWiki's title normalisation (main namespace): underscores to spaces, trimmed, first letter upper."""
    title = " ".join(title.replace("_", " ").split())
    return title[:1].upper() + title[1:]


class MediaWikiStandin(_Standin):
    """``pages``: ``[{"title": ..., "text": ..., "redirects": [alias titles] (optional)}]``."""

    API_PATH = "/w/api.php"

    def __init__(self, pages: list[dict]):
        super().__init__()
        self.pages = [dict(p, pageid=n) for n, p in enumerate(pages, start=1)]

    @property
    def api_url(self) -> str:
        return self.base_url + self.API_PATH

    def handle(self, path, params, headers) -> Reply:
        if path != self.API_PATH:
            return Reply(404, "text/html; charset=utf-8", "<html><body>Not Found</body></html>")
        try:
            return json_reply(self._query(params))
        except _ApiError as err:
            body = {"error": {"code": err.code, "info": err.info,
                              "docref": "See /w/api.php for API usage."}, "servedby": "standin"}
            return Reply(200, "application/json; charset=utf-8", json.dumps(body),
                         {"MediaWiki-API-Error": err.code})

    def _query(self, params: dict) -> dict:
        action = params.get("action", "help")
        if action != "query":
            raise _ApiError("badvalue", f'Unrecognized value for parameter "action": {action}.')
        if params.get("format", "json") != "json":
            raise _ApiError("badvalue", f'Unrecognized value for parameter "format": {params["format"]}.')
        query: dict = {}
        out = {"batchcomplete": True, "query": query}
        if "list" in params:
            if params["list"] != "search":
                raise _ApiError("badvalue", f'Unrecognized value for parameter "list": {params["list"]}.')
            query.update(self._search(params))
        if "prop" in params or "titles" in params:
            query.update(self._pages(params))
            self._limit_whole_extracts(params, query, out)
        if not query:
            out.pop("query")
        return out

    @staticmethod
    def _limit_whole_extracts(params: dict, query: dict, out: dict) -> None:
        """TextExtracts returns one whole-article extract per request (several only with ``exintro``); the
        rest follow with ``excontinue``."""
        with_extract = [p for p in query.get("pages", []) if "extract" in p]
        if params.get("exintro") not in (None, "0", "false") or len(with_extract) <= 1:
            return
        offset = int(params.get("excontinue", "0") or 0)
        for n, page in enumerate(with_extract):
            if n != offset:
                page.pop("extract")
        out["warnings"] = {"extracts": {"warnings": "exlimit was too large for a whole article extracts "
                                                    "request, lowered to 1."}}
        if offset + 1 < len(with_extract):
            out.pop("batchcomplete", None)
            out["continue"] = {"excontinue": offset + 1, "continue": "||"}

    def _search(self, params: dict) -> dict:
        text = params.get("srsearch", "")
        if not text.strip():
            raise _ApiError("missingparam", 'The "srsearch" parameter must be set.')
        limit = _integer(params, "srlimit", 10, 1, 500)
        scored = [(2 * _overlap(text, p["title"]) + _overlap(text, p["text"]), p) for p in self.pages]
        hits = [p for s, p in sorted(scored, key=lambda sp: -sp[0]) if s > 0]
        return {"searchinfo": {"totalhits": len(hits)},
                "search": [self._hit(p, text) for p in hits[:limit]]}

    @staticmethod
    def _hit(page: dict, query: str) -> dict:
        wanted = set(_words(query))
        words = page["text"].split()[:25]
        snippet = " ".join(f'<span class="searchmatch">{w}</span>' if w.lower().strip(".,") in wanted else w
                           for w in words)
        return {"ns": 0, "title": page["title"], "pageid": page["pageid"], "size": len(page["text"].encode()),
                "wordcount": len(page["text"].split()), "snippet": snippet, "timestamp": "2024-01-01T00:00:00Z"}

    def _pages(self, params: dict) -> dict:
        props = set(filter(None, params.get("prop", "").split("|")))
        unknown = props - {"extracts", "info"}
        if unknown:
            raise _ApiError("badvalue", f'Unrecognized value for parameter "prop": {sorted(unknown)[0]}.')
        titles = [t for t in params.get("titles", "").split("|") if t.strip()]
        if len(titles) > 50:
            raise _ApiError("toomanyvalues", 'Too many values supplied for parameter "titles". The limit is 50.')
        result: dict = {"pages": []}
        normalized, redirects = [], []
        for asked in titles:
            title = normalise_title(asked)
            if title != asked:
                normalized.append({"fromencoded": False, "from": asked, "to": title})
            page = self._find(title)
            if page is None and params.get("redirects") not in (None, "0", "false"):
                page = self._redirect_target(title)
                if page is not None:
                    redirects.append({"from": title, "to": page["title"]})
            result["pages"].append(self._page(page, title, props, params))
        if normalized:
            result["normalized"] = normalized
        if redirects:
            result["redirects"] = redirects
        return result

    def _find(self, title: str) -> dict | None:
        return next((p for p in self.pages if normalise_title(p["title"]) == title), None)

    def _redirect_target(self, title: str) -> dict | None:
        return next((p for p in self.pages if title in {normalise_title(a) for a in p.get("redirects", ())}), None)

    def _page(self, page: dict | None, title: str, props: set, params: dict) -> dict:
        if page is None:
            return {"ns": 0, "title": title, "missing": True}
        out = {"pageid": page["pageid"], "ns": 0, "title": page["title"]}
        if "extracts" in props:
            text = page["text"]
            if params.get("exintro") not in (None, "0", "false"):
                text = text.split("\n\n")[0]
            out["extract"] = text if params.get("explaintext") not in (None, "0", "false") else \
                "".join(f"<p>{para}</p>" for para in text.split("\n\n"))
        if "info" in props and "url" in params.get("inprop", "").split("|"):
            url = f"{self.base_url}/wiki/{quote(page['title'].replace(' ', '_'))}"
            out.update(fullurl=url, editurl=url + "?action=edit", canonicalurl=url)
        return out


class _ApiError(Exception):
    def __init__(self, code: str, info: str):
        super().__init__(info)
        self.code, self.info = code, info


def _integer(params: dict, name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "max":
        return default if raw is None else high
    if not re.fullmatch(r"-?\d+", raw):
        raise _ApiError("badinteger", f'Invalid value "{raw}" for integer parameter "{name}".')
    return max(low, min(high, int(raw)))


def _matching(results: list[dict], query: str, text_key: str) -> list[dict]:
    return [r for r in results if _overlap(query, f"{r.get('title', '')} {r.get(text_key, '')}") > 0]


class SearxngStandin(_Standin):
    """``results``: ``[{"title", "url", "content"}]``; a query gets the ones sharing a word with it."""

    def __init__(self, results: list[dict]):
        super().__init__()
        self.results = results

    @property
    def api_url(self) -> str:
        return self.base_url

    def handle(self, path, params, headers) -> Reply:
        if path != "/search":
            return Reply(404, "text/html; charset=utf-8", "<html><body>Not Found</body></html>")
        if params.get("format") != "json":  # SearXNG answers 403 for a format not enabled in its settings
            return Reply(403, "text/html; charset=utf-8", "<html><body>Forbidden</body></html>")
        query = params.get("q", "")
        if not query.strip():
            return Reply(400, "text/html; charset=utf-8", "<html><body>Bad Request</body></html>")
        hits = [dict(r, engine="standin", engines=["standin"], score=1.0, category="general",
                     parsed_url=list(urlparse(r["url"])), positions=[n])
                for n, r in enumerate(_matching(self.results, query, "content"), start=1)]
        return json_reply({"query": query, "number_of_results": len(hits), "results": hits, "answers": [],
                           "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": []})


class BraveStandin(_Standin):
    """``results``: ``[{"title", "url", "description"}]``; needs ``X-Subscription-Token: api_key``."""

    API_PATH = "/res/v1/web/search"

    def __init__(self, results: list[dict], api_key: str):
        super().__init__()
        self.results = results
        self.api_key = api_key

    @property
    def api_url(self) -> str:
        return self.base_url + self.API_PATH

    def handle(self, path, params, headers) -> Reply:
        if path != self.API_PATH:
            return self._error(404, "RESOURCE_NOT_FOUND", "Resource not found.")
        if headers.get("X-Subscription-Token") != self.api_key:
            return self._error(422, "SUBSCRIPTION_TOKEN_INVALID", "The provided subscription token is invalid.")
        query = params.get("q", "")
        count = params.get("count", "20")
        if not query.strip() or not count.isdigit() or not 1 <= int(count) <= 20:
            return self._error(422, "VALIDATION", "Unable to validate request parameter(s).")
        hits = [dict(r, type="search_result", language="en", family_friendly=True, is_source_local=False,
                     meta_url={"scheme": urlparse(r["url"]).scheme, "hostname": urlparse(r["url"]).hostname})
                for r in _matching(self.results, query, "description")[:int(count)]]
        body = {"type": "search", "query": {"original": query, "more_results_available": False}}
        if hits:
            body["web"] = {"type": "search", "results": hits, "family_friendly": True}
        return json_reply(body)

    @staticmethod
    def _error(status: int, code: str, detail: str) -> Reply:
        return json_reply({"type": "ErrorResponse", "error": {"id": "standin", "status": status, "code": code,
                                                              "detail": detail}, "time": int(time.time())}, status)


class PageServer(_Standin):
    """``pages``: ``{path: (status, content_type, body)}``; a 3xx status redirects to ``body``."""

    content_type = "text/html; charset=utf-8"

    def __init__(self, pages: dict[str, tuple[int, str, bytes | str]]):
        super().__init__()
        self.pages = pages

    def url(self, path: str) -> str:
        return self.base_url + path

    def handle(self, path, params, headers) -> Reply:
        if path not in self.pages:
            return Reply(404, "text/html; charset=utf-8", "<html><body>Not Found</body></html>")
        status, content_type, body = self.pages[path]
        if 300 <= status < 400:
            return Reply(status, "text/html; charset=utf-8", "", {"Location": str(body)})
        return Reply(status, content_type, body)
