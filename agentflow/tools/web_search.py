"""The ``web_search`` tool: ask a search provider, open the top result pages, extract their main text
(trafilatura), and return the passages closest to the query (sentence embeddings), with titles and URLs.

Providers (``provider``, else ``$AGENTFLOW_WEB_SEARCH_PROVIDER``, else ``searxng``):

* ``searxng``: ``GET {endpoint}/search?q=...&format=json`` of a SearXNG instance (JSON output enabled in its
  ``search.formats``); ``results[].title/url/content``. ``endpoint`` (or ``$AGENTFLOW_WEB_SEARCH_URL``) is needed.
* ``brave``: the Brave Search API, ``GET {endpoint}?q=...&count=N`` with ``X-Subscription-Token`` from
  ``$AGENTFLOW_WEB_SEARCH_API_KEY``; ``web.results[].title/url/description``.

The provider endpoint is the operator's (it may be private, e.g. SearXNG in the cluster). Result pages are not:
they are fetched through an AddressGuard that refuses non-public addresses (every redirect hop included) unless
``allow_private_pages`` or ``allowed_private_networks`` says otherwise. A result whose URL does not parse as an
http(s) URL is dropped (the call fails only when no result is left). A page that fails is skipped and
counted in ``meta``; when every page fails, the answer is the providers' snippets. The API key never appears
in an answer, an error or a log line.
"""

from __future__ import annotations

import html
import ipaddress
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from agentflow.config import setting
from agentflow.domain.deadline import Deadline
from agentflow.errors import InvalidInput
from agentflow.tools.base import ToolResult, ToolSpec
from agentflow.tools.fetch import PAGE_TYPES, AddressGuard, Fetcher, FetchError, check_url
from agentflow.tools.rank import top_passages

log = logging.getLogger(__name__)
ENV_PROVIDER = "AGENTFLOW_WEB_SEARCH_PROVIDER"
ENV_ENDPOINT = "AGENTFLOW_WEB_SEARCH_URL"
ENV_API_KEY = "AGENTFLOW_WEB_SEARCH_API_KEY"
BRAVE_ENDPOINT = "https://api.search.brave.com/res/v1/web/search"
MAX_SNIPPET_CHARS = 600
RANKING_RESERVE = 0.25  # share of the time kept for extraction and ranking, not given to page fetches


@dataclass(frozen=True)
class WebSearchConfig:
    provider: str = setting("", f"searxng or brave; empty: ${ENV_PROVIDER}, else searxng")
    endpoint: str = setting("", f"provider URL; empty: ${ENV_ENDPOINT}, else the provider's default "
                                f"(brave: {BRAVE_ENDPOINT}; searxng has none)")
    timeout_s: float = setting(20.0, "limit of one call in seconds (search, pages and ranking)")
    top_k: int = setting(3, "passages returned per query")
    results: int = setting(5, "search results asked of the provider")
    pages: int = setting(3, "result pages opened per query")
    max_bytes: int = setting(2_000_000, "largest page read, in bytes (bigger ones are skipped)")
    allow_private_pages: bool = setting(False, "open result pages on private/loopback/link-local addresses")
    allowed_private_networks: tuple[str, ...] = setting((), "non-public networks result pages may be on, e.g. "
                                                            "10.1.0.0/16 for an intranet")
    attempts: int = setting(3, "tries per request on HTTP 429/5xx and dropped connections")
    user_agent: str = setting("", "User-Agent header; empty: AgentFlow/<version> (+https://github.com/agentflow; "
                                  "tools)")

    def __post_init__(self) -> None:
        if min(self.timeout_s, self.top_k, self.results, self.max_bytes, self.attempts) <= 0 or self.pages < 0:
            raise InvalidInput(f"web_search settings must be positive, got {self!r}")
        for network in self.allowed_private_networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError as exc:
                raise InvalidInput(f"web_search allowed_private_networks: {network!r} is not a network") from exc
        if self.provider and self.provider not in PROVIDERS:
            raise InvalidInput(f"web_search provider must be one of {', '.join(PROVIDERS)}, got {self.provider!r}")


class Secret:
    """A string that shows as *** in reprs and logs; ``.value`` is the string."""

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "Secret('***')" if self.value else "Secret('')"

    def __bool__(self) -> bool:
        return bool(self.value)


class Hit(NamedTuple):
    title: str
    url: str
    snippet: str


class Provider(Protocol):
    name: str

    def search(self, query: str, n: int, deadline: Deadline) -> list[Hit]:
        """At most ``n`` results; FetchError on failure."""
        ...


class SearxngProvider:
    name = "searxng"

    def __init__(self, endpoint: str, fetcher: Fetcher):
        if not endpoint:
            raise FetchError("unavailable", f"no SearXNG endpoint configured (set {ENV_ENDPOINT} or the "
                                            f"web_search endpoint setting)")
        base = endpoint.rstrip("/")
        self.url = base if base.endswith("/search") else base + "/search"
        self.fetcher = fetcher

    def search(self, query: str, n: int, deadline: Deadline) -> list[Hit]:
        body = self.fetcher.get(self.url, deadline, params={"q": query, "format": "json"},
                                headers={"Accept": "application/json"}).json()
        items = body.get("results") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise FetchError("bad_response", "the SearXNG answer has no results list")
        return _hits(items, "content")[:n]


class BraveProvider:
    name = "brave"

    def __init__(self, endpoint: str, fetcher: Fetcher, api_key: Secret):
        if not api_key:
            raise FetchError("unavailable", f"no Brave Search API key (set {ENV_API_KEY})")
        self.url = endpoint or BRAVE_ENDPOINT
        self.fetcher = fetcher
        self._key = api_key

    def __repr__(self) -> str:
        return f"BraveProvider({self.url!r})"

    def search(self, query: str, n: int, deadline: Deadline) -> list[Hit]:
        headers = {"Accept": "application/json", "X-Subscription-Token": self._key.value}
        try:
            fetched = self.fetcher.get(self.url, deadline, params={"q": query, "count": min(n, 20)}, headers=headers)
        except FetchError as err:
            raise FetchError(err.kind, err.message.replace(self._key.value, "***")) from None
        body = fetched.json()
        web = body.get("web", {}) if isinstance(body, dict) else None
        items = web.get("results", []) if isinstance(web, dict) else None
        if not isinstance(items, list):
            raise FetchError("bad_response", "the Brave answer's web.results is not a list")
        return _hits(items, "description")[:n]


PROVIDERS = {"searxng": SearxngProvider, "brave": BraveProvider}


def _hits(items: list, snippet_key: str) -> list[Hit]:
    """The results with a usable http(s) URL (``check_url``); one without is dropped, the call fails
    (``bad_response``) only when none is left."""
    hits = []
    for item in items:
        try:
            url = check_url(item.get("url") if isinstance(item, dict) else None)
        except FetchError:
            continue
        title = _plain(item.get("title")) or url
        hits.append(Hit(title, url, _plain(item.get(snippet_key))[:MAX_SNIPPET_CHARS]))
    if items and not hits:
        raise FetchError("bad_response", f"none of the provider's {len(items)} results has a usable URL")
    if len(hits) < len(items):
        log.warning("dropped %d of %d web search results without a usable URL", len(items) - len(hits), len(items))
    return hits


def _plain(value) -> str:
    """Text without the tags and entities providers put in titles and snippets (e.g. <strong>)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", value)).split()) if isinstance(value, str) else ""


class WebSearchTool:
    """Web search, then the top pages' main text, ranked into passages."""

    def __init__(self, config: WebSearchConfig | None = None, *, embedder=None):
        self.config = config or WebSearchConfig()
        self.provider_name = self.config.provider or os.environ.get(ENV_PROVIDER, "") or "searxng"
        self.endpoint = self.config.endpoint or os.environ.get(ENV_ENDPOINT, "")
        self._api_key = Secret(os.environ.get(ENV_API_KEY, ""))
        self._embedder = embedder
        self._api = Fetcher(user_agent=self.config.user_agent, attempts=self.config.attempts)
        guard = AddressGuard(allow_private=self.config.allow_private_pages,
                             allowed_networks=self.config.allowed_private_networks)
        self._pages = Fetcher(user_agent=self.config.user_agent, attempts=min(2, self.config.attempts), guard=guard)
        self.spec = ToolSpec(
            name="web_search",
            description=(f"Searches the web, opens the top {self.config.pages} result pages and returns the "
                         f"{self.config.top_k} passages closest to the query, each as '[n] Page title (URL)' then "
                         f"about 100 words of page text (the search snippets when no page could be read)."),
            input_format="a web search query, e.g. 'population of Lisbon 2021'",
            examples=("latest stable Python release", "who won the 2022 Tour de France"),
            limitations="text of public web pages only (no PDFs, images or logins); may be out of date or wrong; "
                        "quote the URL when you use a passage",
        )

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        result = self._answer(command.strip(), Deadline(min(self.config.timeout_s, timeout)))
        result.duration_s = time.monotonic() - started
        return _scrubbed(result, self._api_key.value)

    def _provider(self) -> Provider:
        if self.provider_name not in PROVIDERS:
            raise FetchError("invalid_input", f"unknown web search provider {self.provider_name!r} "
                                              f"(known: {', '.join(PROVIDERS)})")
        if self.provider_name == "brave":
            return BraveProvider(self.endpoint, self._api, self._api_key)
        return SearxngProvider(self.endpoint, self._api)

    def _answer(self, query: str, deadline: Deadline) -> ToolResult:
        if not query:
            return ToolResult(error="invalid_input: empty query")
        try:
            hits = self._provider().search(query, self.config.results, deadline)
        except FetchError as err:
            return ToolResult(error=str(err))
        meta = {"provider": self.provider_name, "results": len(hits)}
        if not hits:
            return ToolResult(output=f"No web results for {query!r}.", meta=meta)
        documents, skipped = self._read_pages(hits[: self.config.pages], deadline)
        meta.update(pages_read=len(documents), pages_skipped=len(skipped), skipped=skipped)
        ranked = top_passages(query, documents, self.config.top_k, embedder=self._embed()) if documents else []
        if not ranked:
            meta.update(fallback="snippets", urls=[h.url for h in hits[: self.config.top_k]])
            return ToolResult(output=_format_snippets(hits[: self.config.top_k]), meta=meta)
        meta.update(urls=[p.url for _, p in ranked], titles=[p.title for _, p in ranked],
                    scores=[round(s, 4) for s, _ in ranked])
        return ToolResult(output=_format_passages(ranked), meta=meta)

    def _read_pages(self, hits: list[Hit], deadline: Deadline) -> tuple[list[tuple[str, str, str]], list[dict]]:
        """(title, text, url) of the pages read; ``{"url", "error"}`` of those skipped."""
        budget = Deadline(deadline.remaining() * (1 - RANKING_RESERVE))
        documents, skipped = [], []
        for n, hit in enumerate(hits):
            share = budget.remaining() / (len(hits) - n)  # each page its share of what is left
            try:
                text = self._page_text(hit.url, budget, share)
            except FetchError as err:
                skipped.append({"url": hit.url, "error": err.kind})
                continue
            if text:
                documents.append((hit.title, text, hit.url))
            else:
                skipped.append({"url": hit.url, "error": "no_text"})
        return documents, skipped

    def _page_text(self, url: str, deadline: Deadline, timeout_s: float) -> str:
        page = self._pages.get(url, deadline, max_bytes=self.config.max_bytes, content_types=PAGE_TYPES,
                               timeout_s=timeout_s)
        if page.content_type == "text/plain":
            return page.text().strip()
        import trafilatura  # slow to import: only when a page is read

        return (trafilatura.extract(page.text(), url=page.url, include_comments=False, include_tables=True)
                or "").strip()

    def _embed(self):
        if self._embedder is None:
            from agentflow.retrieval.embedder import shared_embedder

            self._embedder = shared_embedder()
        return self._embedder


def _format_passages(ranked) -> str:
    return "\n\n".join(f"[{n}] {p.title} ({p.url})\n{p.text}" for n, (_, p) in enumerate(ranked, start=1))


def _format_snippets(hits: list[Hit]) -> str:
    blocks = [f"[{n}] {h.title} ({h.url})\n{h.snippet or '(no snippet)'}" for n, h in enumerate(hits, start=1)]
    return "No result page could be read; the search snippets:\n\n" + "\n\n".join(blocks)


def _scrubbed(result: ToolResult, secret: str) -> ToolResult:
    """The result with ``secret`` masked wherever it might have slipped in (a provider echoing it back)."""
    if secret and (secret in result.output or secret in result.error or secret in repr(result.meta)):
        result.output = result.output.replace(secret, "***")
        result.error = result.error.replace(secret, "***")
        result.meta = {"redacted": True, **{k: v for k, v in result.meta.items() if secret not in repr(v)}}
    return result
