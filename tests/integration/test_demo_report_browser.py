"""The demo report in a real browser: headless Chromium renders report.html, and its numbers are report.json's."""

import json
import subprocess
from html.parser import HTMLParser

import pytest

from agentflow.demo.report import write_report
from tests.unit.test_demo_view import assert_html_matches_json, rich_state

pytestmark = pytest.mark.slow


def headless(chromium: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    command = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


class TaggedValues(HTMLParser):
    """The text of every `data-key` element of a page, and the page's images."""

    def __init__(self):
        super().__init__()
        self.values, self.images, self._key = {}, [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "data-key" in attrs:
            self._key = attrs["data-key"]
            self.values[self._key] = ""
        if tag == "img":
            self.images.append(attrs.get("src"))

    def handle_endtag(self, tag):
        self._key = None

    def handle_data(self, data):
        if self._key:
            self.values[self._key] += data


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    return write_report(rich_state(), tmp_path_factory.mktemp("demo-report"))


def test_dom_numbers_equal_report_json(chromium, report, tmp_path):
    dom = headless(chromium, tmp_path, "--dump-dom", f"file://{report['html']}").stdout
    assert "<h1>AgentFlow demo report</h1>" in dom
    page = TaggedValues()
    page.feed(dom)
    data = json.loads(open(report["json"]).read())
    assert_html_matches_json(page.values, data)
    assert page.values["summary.heldout_after"] == "0.85" and page.values["summary.rolled_back"] == "1"
    assert page.images == ["reward_curves.png"]
    assert "4bf92f3577b34da6a3ce929d0e0e4736</a>" in dom


def test_screenshot_is_not_blank(chromium, report, tmp_path):
    from matplotlib.image import imread

    shot = tmp_path / "report.png"
    headless(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1200,1600", f"file://{report['html']}")
    assert shot.stat().st_size > 50_000
    pixels = imread(shot)
    assert pixels.shape[:2] == (1600, 1200)
    inked = (pixels[..., :3].min(axis=-1) < 0.9).mean()  # share of pixels that are not (near) white
    assert inked > 0.03, inked
