"""The wikipedia and web_search tools against local stand-ins of MediaWiki, SearXNG, Brave and web pages."""

import json
import logging
import time

import pytest

from agentflow.retrieval.embedder import shared_embedder
from agentflow.tools.web_search import WebSearchConfig, WebSearchTool
from agentflow.tools.wikipedia import WikipediaConfig, WikipediaTool
from tests.standins.web import BraveStandin, MediaWikiStandin, PageServer, Reply, SearxngStandin, json_reply

ARTICLES = [
    {"title": "Lisbon", "text": "Lisbon is the capital and largest city of Portugal, with about 545,000 "
                                "residents.\n\nThe city lies on the estuary of the Tagus river. Its trams climb "
                                "steep hills.", "redirects": ["Lisboa"]},
    {"title": "Porto", "text": "Porto is the second-largest city in Portugal.\n\nPort wine is shipped from its "
                               "cellars on the Douro river."},
    {"title": "Tagus", "text": "The Tagus is the longest river of the Iberian Peninsula, reaching the sea at "
                               "Lisbon."},
]
LISBON_HTML = ("<html><head><title>Lisbon guide</title></head><body><nav>Home | About</nav><article>"
               "<h1>Visiting Lisbon</h1><p>Lisbon has about 545,000 inhabitants and is the capital of Portugal."
               "</p><p>The yellow trams of Lisbon climb steep hills above the Tagus river every day.</p>"
               "</article><footer>Copyright</footer></body></html>")
KEY = "brave-secret-token-123"
LOOPBACK = ("127.0.0.0/8",)


@pytest.fixture(scope="module")
def embedder():
    return shared_embedder()


@pytest.fixture()
def wiki():
    with MediaWikiStandin(ARTICLES) as standin:
        yield standin


def wiki_tool(standin, embedder, **settings):
    return WikipediaTool(WikipediaConfig(endpoint=standin.api_url, **settings), embedder=embedder)


# --- wikipedia -------------------------------------------------------------------------------------------------------

def test_wikipedia_returns_ranked_passages_with_titles_and_urls(wiki, embedder):
    result = wiki_tool(wiki, embedder, top_k=2).run("How many people live in Lisbon?", timeout=20)
    assert result.ok, result.error
    first = result.output.split("\n\n")[0]
    assert first.startswith(f"[1] Lisbon ({wiki.base_url}/wiki/Lisbon)\n") and "545,000" in first
    assert result.meta["hits"] == 2 and result.meta["urls"][0] == f"{wiki.base_url}/wiki/Lisbon"
    searched, *extracts = wiki.requests
    assert searched["params"]["list"] == "search" and searched["params"]["formatversion"] == "2"
    assert len(extracts) == len(result.meta["pages"]) >= 2  # one whole-article extract per request (continue)
    assert searched["headers"]["User-Agent"].startswith("AgentFlow/")


def test_wikipedia_no_match_is_not_an_error(wiki, embedder):
    result = wiki_tool(wiki, embedder).run("xylophone quasar", timeout=10)
    assert result.ok and result.output == "No Wikipedia articles matched 'xylophone quasar'."
    assert wiki.count == 1


def test_wikipedia_retries_a_429_then_succeeds(wiki, embedder):
    wiki.faults = ["429"]
    result = wiki_tool(wiki, embedder).run("Port wine", timeout=20)
    assert result.ok, result.error
    assert "Porto" in result.meta["titles"] and wiki.requests[0]["params"] == wiki.requests[1]["params"]


def test_wikipedia_5xx_is_retried_then_unavailable(wiki, embedder):
    wiki.faults = ["503", "500", "502", "500"]
    result = wiki_tool(wiki, embedder, attempts=3).run("Lisbon", timeout=20)
    assert result.error.startswith("unavailable:") and "HTTP 502" in result.error
    assert wiki.count == 3


def test_wikipedia_timeout(wiki, embedder):
    wiki.faults, wiki.slow_s = ["timeout"], 2.0
    started = time.monotonic()
    result = wiki_tool(wiki, embedder).run("Lisbon", timeout=0.5)
    assert result.error.startswith("timeout:")
    assert time.monotonic() - started < 1.5


def test_wikipedia_oversized_answer_is_too_large(wiki, embedder):
    wiki.faults = ["oversize"]
    result = wiki_tool(wiki, embedder, max_bytes=100_000).run("Lisbon", timeout=10)
    assert result.error.startswith("too_large:")


def test_wikipedia_api_errors_and_non_json_are_bad_responses(wiki, embedder):
    error = {"error": {"code": "maxlag", "info": "Waiting for a database server: 7 seconds lagged."}}
    wiki.faults = [Reply(200, "application/json", json.dumps(error)), Reply(200, "text/html", "<html>down</html>")]
    tool = wiki_tool(wiki, embedder, cache_ttl_s=0)
    assert tool.run("Lisbon", timeout=10).error == ("bad_response: MediaWiki API error maxlag: Waiting for a "
                                                   "database server: 7 seconds lagged.")
    assert tool.run("Lisbon", timeout=10).error.startswith("bad_response:")


def test_wikipedia_answers_are_cached_per_normalised_query(wiki, embedder):
    tool = wiki_tool(wiki, embedder)
    first = tool.run("Tagus river", timeout=20)
    count = wiki.count
    again = tool.run("  tagus   RIVER ", timeout=20)
    assert again.output == first.output and again.meta["cached"] and wiki.count == count
    uncached = wiki_tool(wiki, embedder, cache_ttl_s=0)
    uncached.run("Tagus river", timeout=20)
    uncached.run("Tagus river", timeout=20)
    assert wiki.count == 3 * count


def test_wikipedia_endpoint_from_the_environment(wiki, embedder, monkeypatch):
    monkeypatch.setenv("AGENTFLOW_WIKIPEDIA_URL", wiki.api_url)
    tool = WikipediaTool(embedder=embedder)
    assert tool.endpoint == wiki.api_url and tool.run("Porto", timeout=20).ok
    monkeypatch.delenv("AGENTFLOW_WIKIPEDIA_URL")
    assert WikipediaTool().endpoint == "https://en.wikipedia.org/w/api.php"


def test_wikipedia_empty_query(wiki, embedder):
    assert wiki_tool(wiki, embedder).run("   ", timeout=5).error.startswith("invalid_input:")


# --- web_search ------------------------------------------------------------------------------------------------------

@pytest.fixture()
def pages():
    with PageServer({
        "/lisbon": (200, "text/html; charset=utf-8", LISBON_HTML),
        "/porto.txt": (200, "text/plain", "Porto is famous for port wine, aged in cellars by the Douro river."),
        "/report.pdf": (200, "application/pdf", b"%PDF-1.7 binary"),
        "/big": (200, "text/html", "<html><body><p>" + "Lisbon trams " * 50_000 + "</p></body></html>"),
        "/moved": (302, "", "http://10.0.0.1/latest/meta-data/"),
        "/metadata": (301, "", "http://169.254.169.254/latest/meta-data/"),
    }) as server:
        yield server


def results_for(pages, *paths, text_key="content"):
    return [{"title": f"Page {path}", "url": pages.url(path), text_key: f"Lisbon Porto snippet for {path}"}
            for path in paths]


def web_tool(endpoint, embedder, **settings):
    settings.setdefault("allowed_private_networks", LOOPBACK)
    return WebSearchTool(WebSearchConfig(endpoint=endpoint, **settings), embedder=embedder)


def test_searxng_success_reads_pages_and_ranks_passages(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon", "/porto.txt")) as searx:
        result = web_tool(searx.api_url, embedder, top_k=2).run("How many inhabitants does Lisbon have?", 20)
        assert searx.requests[0]["params"] == {"q": "How many inhabitants does Lisbon have?", "format": "json"}
    assert result.ok, result.error
    assert result.output.startswith(f"[1] Page /lisbon ({pages.url('/lisbon')})\n") and "545,000" in result.output
    assert "Copyright" not in result.output  # boilerplate left out by the main-text extraction
    assert "port wine, aged in cellars" in result.output  # text/plain used as it is
    assert result.meta["pages_read"] == 2 and result.meta["pages_skipped"] == 0


def test_no_web_results_is_not_an_error(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon")) as searx:
        result = web_tool(searx.api_url, embedder).run("xylophone", 10)
    assert result.ok and result.output == "No web results for 'xylophone'." and pages.count == 0


def test_provider_429_then_success(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon")) as searx:
        searx.faults = ["429"]
        result = web_tool(searx.api_url, embedder).run("Lisbon", 20)
        assert result.ok, result.error
        assert searx.count == 2


def test_provider_5xx_retried_then_unavailable(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon")) as searx:
        searx.faults = ["500"] * 5
        result = web_tool(searx.api_url, embedder, attempts=3).run("Lisbon", 20)
        assert result.error.startswith("unavailable:") and searx.count == 3


def test_provider_timeout(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon")) as searx:
        searx.faults, searx.slow_s = ["timeout"], 2.0
        result = web_tool(searx.api_url, embedder).run("Lisbon", 0.5)
    assert result.error.startswith("timeout:")


def test_bad_pages_are_skipped_and_counted(pages, embedder):
    paths = ("/big", "/report.pdf", "/moved", "/metadata", "/lisbon")
    with SearxngStandin(results_for(pages, *paths)) as searx:
        result = web_tool(searx.api_url, embedder, pages=5, max_bytes=200_000).run("Lisbon trams", 30)
    assert result.ok, result.error
    assert result.meta["pages_read"] == 1 and result.meta["pages_skipped"] == 4
    assert [s["error"] for s in result.meta["skipped"]] == ["too_large", "unsupported_content", "forbidden",
                                                           "forbidden"]
    assert result.meta["urls"] == [pages.url("/lisbon")]


def test_private_pages_are_refused_by_default(pages, embedder):
    with SearxngStandin(results_for(pages, "/lisbon", "/porto.txt")) as searx:
        result = web_tool(searx.api_url, embedder, allowed_private_networks=()).run("Lisbon", 20)
    assert result.ok and result.meta["fallback"] == "snippets" and pages.count == 0
    assert result.output.startswith("No result page could be read; the search snippets:\n\n[1] Page /lisbon (")
    assert [s["error"] for s in result.meta["skipped"]] == ["forbidden", "forbidden"]


def test_page_timeouts_are_skipped_within_the_deadline(pages, embedder):
    pages.faults, pages.slow_s = ["timeout"], 5.0
    with SearxngStandin(results_for(pages, "/lisbon", "/porto.txt")) as searx:
        started = time.monotonic()
        result = web_tool(searx.api_url, embedder, attempts=1).run("Porto wine", 4)
    assert time.monotonic() - started < 4.5
    assert result.ok and result.meta["skipped"] == [{"url": pages.url("/lisbon"), "error": "timeout"}]


MALFORMED_URLS = ["http://[::1", "ht!tp://x", "http://exa mple.com/", "http://a.example/\r\nX-Injected: 1",
                  "http://a.example/\x00", "http://\u2028a.example/", "http://a.example:99999/", 42, None]


@pytest.mark.parametrize("provider", ["searxng", "brave"])
def test_malformed_result_urls_drop_those_results_only(pages, embedder, monkeypatch, provider):
    """The provider's answer is sent as it is (a fault ``Reply``): the good result comes last, past the 5 asked for."""
    monkeypatch.setenv("AGENTFLOW_WEB_SEARCH_API_KEY", KEY)
    results = [{"title": f"Bad {n}", "url": url, "content": "Lisbon", "description": "Lisbon"}
               for n, url in enumerate(MALFORMED_URLS)] + results_for(pages, "/lisbon", text_key="description")
    standin = SearxngStandin([]) if provider == "searxng" else BraveStandin([], KEY)
    with standin:
        standin.faults = [json_reply({"results": results} if provider == "searxng" else {"web": {"results": results}})]
        result = web_tool(standin.api_url, embedder, provider=provider).run("Lisbon inhabitants", 20)
    assert result.ok, result.error
    assert result.meta["results"] == 1 and result.meta["pages_read"] == 1 and result.meta["skipped"] == []
    assert result.meta["urls"] == [pages.url("/lisbon")] and "545,000" in result.output


def test_a_provider_answer_without_a_usable_url_is_a_bad_response(pages, embedder):
    with SearxngStandin([]) as searx:
        searx.faults = [json_reply({"results": [{"title": "Bad", "url": url, "content": "Lisbon"}
                                                for url in MALFORMED_URLS]})]
        result = web_tool(searx.api_url, embedder).run("Lisbon", 20)
    assert result.error.startswith("bad_response:") and "usable URL" in result.error and pages.count == 0


def test_brave_success_and_the_key_never_leaks(pages, embedder, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("AGENTFLOW_WEB_SEARCH_API_KEY", KEY)
    with BraveStandin(results_for(pages, "/lisbon", text_key="description"), KEY) as brave:
        tool = web_tool(brave.api_url, embedder, provider="brave")
        ok = tool.run("capital of Portugal Lisbon", 20)
        brave.api_key = "another-key"
        rejected = tool.run("capital of Portugal Lisbon", 20)
        assert brave.requests[0]["headers"]["X-Subscription-Token"] == KEY
        assert brave.requests[0]["params"]["count"] == "5"
    assert ok.ok and ok.meta["provider"] == "brave" and "545,000" in ok.output
    assert rejected.error.startswith("bad_response:") and "422" in rejected.error
    for text in (ok.output, ok.error, repr(ok.meta), rejected.error, repr(rejected.meta), repr(tool.__dict__),
                 repr(tool.config), caplog.text):
        assert KEY not in text


def test_brave_without_a_key_is_unavailable(embedder, monkeypatch):
    monkeypatch.delenv("AGENTFLOW_WEB_SEARCH_API_KEY", raising=False)
    result = WebSearchTool(WebSearchConfig(provider="brave"), embedder=embedder).run("Lisbon", 5)
    assert result.error.startswith("unavailable:") and "AGENTFLOW_WEB_SEARCH_API_KEY" in result.error


def test_provider_and_endpoint_from_the_environment(monkeypatch, embedder):
    monkeypatch.setenv("AGENTFLOW_WEB_SEARCH_PROVIDER", "searxng")
    monkeypatch.delenv("AGENTFLOW_WEB_SEARCH_URL", raising=False)
    result = WebSearchTool(embedder=embedder).run("Lisbon", 5)
    assert result.error.startswith("unavailable:") and "AGENTFLOW_WEB_SEARCH_URL" in result.error
    monkeypatch.setenv("AGENTFLOW_WEB_SEARCH_PROVIDER", "bing")
    assert WebSearchTool(embedder=embedder).run("Lisbon", 5).error.startswith("invalid_input:")
