"""The eval report's item table in a real browser: headless Chromium, driven over the DevTools protocol, renders
report.html of a scripted run; its rows equal results.jsonl, headers sort, the filters filter, a trajectory opens
in the side panel, and a question holding a <script> is shown as text, never run."""

import json
import subprocess
import time
import urllib.request
from itertools import count

import pytest

from agentflow.eval.data import load_items
from agentflow.eval.report import write_reports
from agentflow.eval.runner import run_items
from tests.unit.test_eval import SEARCH, scripted_agent, write_json

from agentflow.children import spawn_tied

pytestmark = pytest.mark.slow
websocket = pytest.importorskip("websocket")  # websocket-client, which the kubernetes client depends on

HOSTILE = "<script>window.__injected = 1</script> Who wrote Hamlet?"


class Page:
    """One headless Chromium tab over the DevTools protocol: ``js`` evaluates an expression and returns its value."""

    def __init__(self, chromium: str, profile):
        self.process = spawn_tied(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--disable-background-networking", "--remote-debugging-port=0", "--remote-allow-origins=*",
             f"--user-data-dir={profile}", "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port(profile / "DevToolsActivePort")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            target = next(t for t in json.load(reply) if t["type"] == "page")
        self.socket = websocket.create_connection(target["webSocketDebuggerUrl"], timeout=30, suppress_origin=True)
        self._ids = count(1)

    def _port(self, marker) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().splitlines()[0])
            assert self.process.poll() is None, "chromium exited"
            time.sleep(0.1)
        raise AssertionError("chromium did not open its DevTools port")

    def call(self, method: str, **params) -> dict:
        ident = next(self._ids)
        self.socket.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == ident:
                assert "error" not in message, message
                return message["result"]

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while self.js("document.readyState") != "complete" or not self.js("!!document.getElementById('items')"):
            assert time.monotonic() < deadline, "the page did not load"
            time.sleep(0.1)

    def close(self) -> None:
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval-report")
    data = SEARCH + [{"pid": "e", "query": HOSTILE, "answer": ["William Shakespeare"]}]
    items, _ = load_items(write_json(folder / "search.json", data), "search")
    answers = {"Who wrote Hamlet?": "Answer: William Shakespeare", "Capital of France?": "Answer: Lyon",
               "Largest planet?": "<answer>Jupiter</answer>"}
    run = {"run_id": "br", "data": str(folder / "search.json"), "kind": "search"}
    outcome = run_items(scripted_agent(answers), items, "search", folder / "run", run=run, concurrency=2,
                        progress=False)
    write_reports(outcome.summary, outcome.out_dir)
    return outcome.out_dir


@pytest.fixture
def page(chromium, run_dir, tmp_path):
    browser = Page(chromium, tmp_path / "profile")
    try:
        browser.open((run_dir / "report.html").resolve().as_uri())
        yield browser
    finally:
        browser.close()


ROWS_JS = """Array.from(document.querySelectorAll('#items tbody tr.item')).filter(r => !r.hidden).map(r => ({
  index: +r.dataset.index, pid: r.dataset.pid, correct: r.dataset.correct, status: r.dataset.status,
  shown_correct: r.querySelector('td[data-col=correct]').textContent,
  shown_status: r.querySelector('td[data-col=status]').textContent,
  latency: +r.querySelector('td[data-col=latency_s]').dataset.value,
  question: r.querySelector('td[data-col=question]').textContent}))"""


def results(run_dir) -> dict[str, dict]:
    return {row["pid"]: row for row in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())}


def test_rows_equal_results_jsonl(page, run_dir):
    expected = results(run_dir)
    shown = page.js(ROWS_JS)
    assert len(shown) == len(expected) == 5
    assert [row["index"] for row in shown] == [0, 1, 2, 3, 4]  # item order, not completion order
    for row in shown:
        want = expected[row["pid"]]
        assert row["correct"] == ("true" if want["correct"] else "false")
        assert row["shown_correct"] == ("yes" if want["correct"] else "no")
        assert row["status"] == row["shown_status"] == want["status"]
        assert row["latency"] == pytest.approx(want["latency_s"])
    assert page.js("document.getElementById('item-count').textContent") == "5 of 5 items"


def test_a_script_in_a_question_is_text(page):
    assert page.js("window.__injected") is None
    assert page.js("document.querySelectorAll('script').length") == 1  # the report's own
    cell = page.js("document.querySelector('tr[data-pid=e] td[data-col=question]').textContent")
    assert cell == HOSTILE


def test_headers_sort_both_ways(page, run_dir):
    latencies = {pid: row["latency_s"] for pid, row in results(run_dir).items()}
    page.js("document.querySelector('th[data-sort=latency_s]').click()")
    assert [r["pid"] for r in page.js(ROWS_JS)] == sorted(latencies, key=lambda p: (latencies[p], p))
    assert page.js("document.querySelector('th[data-sort=latency_s]').getAttribute('aria-sort')") == "ascending"
    page.js("document.querySelector('th[data-sort=latency_s]').click()")
    assert [r["latency"] for r in page.js(ROWS_JS)] == sorted(latencies.values(), reverse=True)
    page.js("document.querySelector('th[data-sort=question]').click()")
    questions = [r["question"] for r in page.js(ROWS_JS)]
    assert questions == sorted(questions, key=str.lower)
    page.js("document.querySelector('th[data-sort=correct]').click()")
    assert [r["correct"] for r in page.js(ROWS_JS)] == ["false"] * 2 + ["true"] * 3


def set_control(page: Page, element_id: str, value: str) -> None:
    """Set a filter control's value and fire the event a user's edit fires."""
    page.js(f"(() => {{ const el = document.getElementById({json.dumps(element_id)}); el.value = {json.dumps(value)};"
            "el.dispatchEvent(new Event(el.tagName === 'SELECT' ? 'change' : 'input')); })()")


def test_filters_by_text_status_and_correctness(page):
    page.js("document.getElementById('item-filter').focus()")
    page.call("Input.insertText", text="hamlet")  # typed, as a user would
    assert sorted(r["pid"] for r in page.js(ROWS_JS)) == ["a", "e"]
    assert page.js("document.getElementById('item-count').textContent") == "2 of 5 items"
    set_control(page, "item-filter", "")
    set_control(page, "item-status", "error")
    assert [r["pid"] for r in page.js(ROWS_JS)] == ["d"]
    set_control(page, "item-status", "")
    set_control(page, "item-correct", "false")
    assert sorted(r["pid"] for r in page.js(ROWS_JS)) == ["b", "d"]
    set_control(page, "item-filter", "lyon")  # the filters combine
    assert [r["pid"] for r in page.js(ROWS_JS)] == ["b"]
    assert page.js("document.getElementById('item-count').textContent") == "1 of 5 items"


def test_a_trajectory_opens_in_the_side_panel(page, run_dir):
    record = results(run_dir)["a"]["record"]
    assert page.js("document.getElementById('trajectory-panel').hidden") is True
    page.js("document.querySelector('tr[data-pid=a] button.view').click()")
    panel = page.js("""(() => { const p = document.getElementById('trajectory-panel');
      const a = Array.from(p.querySelectorAll('article.trajectory')).filter(a => !a.hidden);
      return {hidden: p.hidden, width: p.getBoundingClientRect().width, open: a.map(x => x.id),
              steps: a.length ? a[0].querySelectorAll('li.step').length : 0, text: a.length ? a[0].innerText : ''};
      })()""")
    assert panel["hidden"] is False and panel["width"] > 100 and panel["open"] == ["traj-0"]
    assert panel["steps"] == len(record["turns"]) == 1
    turn = record["turns"][0]
    for text in (record["trajectory_id"], turn["decision"]["sub_goal"], turn["decision"]["tool"], turn["command"],
                 turn["tool_error"], turn["verdict"], record["answer"]):
        assert text and text in panel["text"], text
    page.js("document.getElementById('panel-close').click()")
    assert page.js("document.getElementById('trajectory-panel').hidden") is True
