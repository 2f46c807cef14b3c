"""The ``wikipedia`` tool: search any MediaWiki through its Action API, read the best pages' plain-text
extracts, and return the passages closest to the query (sentence embeddings), with titles and URLs.

Requests (``formatversion=2``): ``list=search`` for the titles, then ``prop=extracts|info`` (``explaintext``,
``redirects``, ``inprop=url``) for their text and URLs, following ``continue`` (TextExtracts gives one
whole-article extract per request). The endpoint is the config's, else ``$AGENTFLOW_WIKIPEDIA_URL``, else
English Wikipedia; it may be a private address (a self-hosted MediaWiki or Kiwix): it is the operator's.
Answers are cached per normalised query for ``cache_ttl_s``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from agentflow.config import setting
from agentflow.domain.deadline import Deadline
from agentflow.errors import InvalidInput
from agentflow.tools.base import ToolResult, ToolSpec
from agentflow.tools.fetch import Fetcher, FetchError
from agentflow.tools.rank import top_passages

DEFAULT_ENDPOINT = "https://en.wikipedia.org/w/api.php"
ENV_ENDPOINT = "AGENTFLOW_WIKIPEDIA_URL"


@dataclass(frozen=True)
class WikipediaConfig:
    endpoint: str = setting("", f"MediaWiki Action API URL (…/w/api.php); empty: ${ENV_ENDPOINT}, else "
                                f"{DEFAULT_ENDPOINT}")
    timeout_s: float = setting(15.0, "limit of one call in seconds (all requests, retries and ranking)")
    top_k: int = setting(3, "passages returned per query")
    search_limit: int = setting(3, "best-matching pages read per query")
    cache_ttl_s: float = setting(3600.0, "how long an answer is reused for the same query; 0: no cache")
    cache_size: int = setting(256, "queries kept in the cache")
    max_bytes: int = setting(5_000_000, "largest API answer read, in bytes")
    attempts: int = setting(3, "tries per request on HTTP 429/5xx and dropped connections")
    user_agent: str = setting("", "User-Agent header; empty: AgentFlow/<version> (+https://github.com/agentflow; "
                                  "tools)")

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.top_k, self.search_limit, self.max_bytes, self.attempts) <= 0 or \
                self.cache_ttl_s < 0 or self.cache_size < 1 or self.search_limit > 50:
            raise InvalidInput(f"wikipedia settings must be positive (search_limit at most 50), got {self!r}")


class TTLCache:
    """A bounded, thread-safe map whose entries expire ``ttl_s`` seconds after they were put."""

    def __init__(self, ttl_s: float, size: int):
        self.ttl_s, self.size = ttl_s, size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is None or item[0] < time.monotonic():
                self._items.pop(key, None)
                return None
            self._items.move_to_end(key)
            return item[1]

    def put(self, key, value) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._items[key] = (time.monotonic() + self.ttl_s, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def normalise_query(query: str) -> str:
    return " ".join(query.lower().split())


class WikipediaTool:
    """Passages of the best-matching pages of a MediaWiki, ranked by similarity to the query."""

    def __init__(self, config: WikipediaConfig | None = None, *, embedder=None):
        self.config = config or WikipediaConfig()
        self.endpoint = self.config.endpoint or os.environ.get(ENV_ENDPOINT, "") or DEFAULT_ENDPOINT
        if urlsplit(self.endpoint).scheme not in ("http", "https"):
            raise InvalidInput(f"wikipedia endpoint must be an http(s) URL, got {self.endpoint!r}")
        self._embedder = embedder
        self._fetcher = Fetcher(user_agent=self.config.user_agent, attempts=self.config.attempts)
        self._cache = TTLCache(self.config.cache_ttl_s, self.config.cache_size)
        self.spec = ToolSpec(
            name="wikipedia",
            description=(f"Searches Wikipedia ({urlsplit(self.endpoint).hostname}) and returns the "
                         f"{self.config.top_k} passages of the best-matching articles closest to the query, "
                         f"each as '[n] Title (URL)' then about 100 words of article text."),
            input_format="a short search query naming the topic, e.g. 'Treaty of Westphalia'",
            examples=("Marie Curie", "largest moon of Saturn"),
            limitations=(f"encyclopedic facts only; reads at most {self.config.search_limit} articles per query; "
                         f"passages are quoted verbatim, not summarised; no results for misspelled queries"),
        )

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        result = self._answer(command.strip(), Deadline(min(self.config.timeout_s, timeout)))
        result.duration_s = time.monotonic() - started
        return result

    def _answer(self, query: str, deadline: Deadline) -> ToolResult:
        if not query:
            return ToolResult(error="invalid_input: empty query")
        key = normalise_query(query)
        cached = self._cache.get(key)
        if cached is not None:
            return ToolResult(output=cached[0], meta=dict(cached[1], cached=True))
        try:
            titles = self._search(query, deadline)
            pages = self._extracts(titles, deadline) if titles else []
        except FetchError as err:
            return ToolResult(error=str(err))
        output, meta = self._ranked(query, pages)
        self._cache.put(key, (output, meta))
        return ToolResult(output=output, meta=dict(meta, cached=False))

    def _api(self, params: dict, deadline: Deadline) -> dict:
        fetched = self._fetcher.get(self.endpoint, deadline, max_bytes=self.config.max_bytes,
                                    params=dict(params, action="query", format="json", formatversion="2"))
        body = fetched.json()
        if not isinstance(body, dict):
            raise FetchError("bad_response", "the MediaWiki API answered with something other than an object")
        error = body.get("error")
        if isinstance(error, dict):
            raise FetchError("bad_response", f"MediaWiki API error {error.get('code', '?')}: "
                                             f"{str(error.get('info', ''))[:300]}")
        return body

    def _search(self, query: str, deadline: Deadline) -> list[str]:
        body = self._api({"list": "search", "srsearch": query, "srlimit": self.config.search_limit,
                          "srprop": ""}, deadline)
        hits = (body.get("query") or {}).get("search")
        if not isinstance(hits, list):
            raise FetchError("bad_response", "the MediaWiki search answer has no query.search list")
        return [h["title"] for h in hits if isinstance(h, dict) and isinstance(h.get("title"), str)]

    def _extracts(self, titles: list[str], deadline: Deadline) -> list[dict]:
        """``[{"title", "text", "url"}]`` of the pages that exist, in search order."""
        found: dict[str, dict] = {}
        params = {"prop": "extracts|info", "inprop": "url", "explaintext": "1", "exlimit": "max",
                  "redirects": "1", "titles": "|".join(titles)}
        cont: dict = {}
        for _ in range(len(titles) + 1):  # one whole-article extract per answer, at most
            body = self._api(dict(params, **cont), deadline)
            for page in _pages(body):
                entry = found.setdefault(page["title"], {"title": page["title"], "text": "", "url": ""})
                entry["text"] = entry["text"] or page.get("extract") or ""
                entry["url"] = entry["url"] or page.get("fullurl") or self._url(page["title"])
            cont = body.get("continue") if isinstance(body.get("continue"), dict) else {}
            if not cont:
                break
        rank = {t: n for n, t in enumerate(titles)}
        return sorted((p for p in found.values() if p["text"].strip()), key=lambda p: rank.get(p["title"], 99))

    def _url(self, title: str) -> str:
        parts = urlsplit(self.endpoint)
        return f"{parts.scheme}://{parts.netloc}/wiki/{quote(title.replace(' ', '_'))}"

    def _ranked(self, query: str, pages: list[dict]) -> tuple[str, dict]:
        documents = [(p["title"], p["text"], p["url"]) for p in pages]
        hits = top_passages(query, documents, self.config.top_k, embedder=self._embed()) if documents else []
        meta = {"pages": [p["title"] for p in pages], "hits": len(hits), "titles": [p.title for _, p in hits],
                "urls": [p.url for _, p in hits], "scores": [round(s, 4) for s, _ in hits]}
        if not hits:
            return f"No Wikipedia articles matched {query!r}.", meta
        return "\n\n".join(f"[{n}] {p.title} ({p.url})\n{p.text}" for n, (_, p) in enumerate(hits, 1)), meta

    def _embed(self):
        if self._embedder is None:
            from agentflow.retrieval.embedder import shared_embedder

            self._embedder = shared_embedder()
        return self._embedder


def _pages(body: dict) -> list[dict]:
    pages = (body.get("query") or {}).get("pages", [])
    if not isinstance(pages, list):
        raise FetchError("bad_response", "the MediaWiki extracts answer has no query.pages list "
                                         "(formatversion=2 expected)")
    return [p for p in pages if isinstance(p, dict) and isinstance(p.get("title"), str) and not p.get("missing")
            and not p.get("invalid")]
