"""``HttpSearchTool``: a tool that forwards its command as a query to a search service reached over HTTP (e.g. a
retriever service). The ``wikipedia`` and ``web_search`` tools are in ``wikipedia.py`` and ``web_search.py``.

Request: ``GET {endpoint}?q=<query>&limit=<top_k>``.
Expected response: status 200 and a JSON body

    {"results": [{"title": "...", "snippet": "...", "url": "..."}, ...]}

where each result has a non-empty ``title`` and ``snippet`` (or ``text``); ``url`` is optional. At most
``top_k`` results are used. The endpoint comes from the tool's config or, when that is empty, from the
environment variable named by ``env_var``, read when the tool is built.

Typed errors: ``invalid_input`` (empty query), ``unavailable`` (no endpoint, connection refused after one
retry, HTTP 5xx), ``timeout``, ``bad_response`` (HTTP 4xx, not JSON, wrong shape).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import httpx

from agentflow.config import setting
from agentflow.domain.deadline import Deadline
from agentflow.errors import InvalidInput
from agentflow.tools.base import ToolResult, ToolSpec

RESPONSE_SHAPE = '{"results": [{"title": str, "snippet" or "text": str, "url": str (optional)}]}'
MAX_SNIPPET_CHARS = 600


@dataclass(frozen=True)
class HttpToolConfig:
    endpoint: str = setting("", "search URL; empty means the tool's environment variable")
    timeout_s: float = setting(10.0, "limit of one call in seconds (retry included)")
    top_k: int = setting(3, "results returned per query")

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.top_k < 1:
            raise InvalidInput(f"HTTP tool settings timeout_s and top_k must be positive, got {self!r}")


class _BadResponse(Exception):
    """The endpoint answered, but not with the documented shape."""


class HttpSearchTool:
    """Sends the command as a query to an HTTP search endpoint and formats the results."""

    def __init__(self, spec: ToolSpec, env_var: str, config: HttpToolConfig | None = None, *, token: str = ""):
        self.config = config or HttpToolConfig()
        self.env_var = env_var
        self.endpoint = self.config.endpoint or os.environ.get(env_var, "")
        self.spec = spec
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}  # never in a result or a log line

    def run(self, command: str, timeout: float) -> ToolResult:
        started = time.monotonic()
        result = self._search(command.strip(), Deadline(min(self.config.timeout_s, timeout)))
        result.duration_s = time.monotonic() - started
        return result

    def _search(self, query: str, deadline: Deadline) -> ToolResult:
        if not query:
            return ToolResult(error="invalid_input: empty query")
        if not self.endpoint:
            return ToolResult(error=f"unavailable: no endpoint configured for {self.spec.name} "
                                    f"(set {self.env_var} or the tool's endpoint setting)")
        try:
            response = self._get_with_retry(query, deadline)
            results = _parse(response)
        except httpx.TimeoutException:
            return ToolResult(error=f"timeout: {self.spec.name} did not answer within {self.config.timeout_s:g} s")
        except httpx.HTTPError as exc:
            return ToolResult(error=f"unavailable: {self.spec.name} endpoint {self.endpoint}: {exc}")
        except _BadResponse as exc:
            return ToolResult(error=f"bad_response: {self.spec.name}: {exc}")
        results = results[: self.config.top_k]
        return ToolResult(output=_format(query, results), meta={"results": len(results)})

    def _get_with_retry(self, query: str, deadline: Deadline) -> httpx.Response:
        params = {"q": query, "limit": self.config.top_k}
        for attempt in (1, 2):
            if deadline.expired():
                raise httpx.TimeoutException("no time left")
            try:
                return httpx.get(self.endpoint, params=params, headers=self._headers, timeout=deadline.remaining())
            except httpx.ConnectError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def _parse(response: httpx.Response) -> list[dict]:
    """Validated results; HTTP 5xx raise httpx.HTTPStatusError (unavailable), other problems _BadResponse."""
    if response.status_code >= 500:
        response.raise_for_status()
    if response.status_code != 200:
        raise _BadResponse(f"HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError as exc:
        raise _BadResponse("the body is not JSON") from exc
    items = body.get("results") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise _BadResponse(f"expected {RESPONSE_SHAPE}")
    return [_result(item) for item in items]


def _result(item) -> dict:
    text = (item.get("snippet") or item.get("text")) if isinstance(item, dict) else None
    title = item.get("title") if isinstance(item, dict) else None
    if not isinstance(title, str) or not isinstance(text, str) or not title.strip() or not text.strip():
        raise _BadResponse(f"each result needs a title and a snippet or text; expected {RESPONSE_SHAPE}")
    url = item.get("url")
    url = url if isinstance(url, str) else ""
    return {"title": title.strip(), "text": text.strip()[:MAX_SNIPPET_CHARS], "url": url}


def _format(query: str, results: list[dict]) -> str:
    if not results:
        return f"No results for {query!r}."
    blocks = []
    for n, r in enumerate(results, start=1):
        source = f"\n({r['url']})" if r["url"] else ""
        blocks.append(f"[{n}] {r['title']}\n{r['text']}{source}")
    return "\n\n".join(blocks)

