"""The demo's view: the dashboard drawn to text, and the report's files and numbers."""

import json
import os
import re

from rich.console import Console

from agentflow.demo.report import write_report
from agentflow.demo.view import new_state, render_dashboard

T0 = 1_760_000_000.0


def rich_state() -> dict:
    """A state in the middle of a run: curves, a canary, a promotion and a rollback, examples."""
    heldout = [{"t_s": 30.0 * i, "success": s, "version": f"v{i}"} for i, s in enumerate((0.2, 0.35, 0.5, 0.85))]
    rewards = [{"t_s": 10.0 * i, "version": i, "reward": r} for i, r in enumerate((0.1, 0.3, 0.25, 0.6, 0.7))]
    decisions = [
        {"t_s": 40.0, "version": "v1", "action": "canary", "percent": 10, "reason": "new version v1",
         "evidence": {}},
        {"t_s": 70.0, "version": "v1", "action": "promote", "percent": 100, "reason": "canary beats stable",
         "evidence": {"canary_reward": 0.61, "stable_reward": 0.4, "n": 24}},
        {"t_s": 95.0, "version": "v2-bad", "action": "rollback", "percent": 0, "reason": "reward fell <0.1>",
         "evidence": {"canary_reward": 0.05, "stable_reward": 0.6, "n": 20}},
    ]
    return new_state(
        started_unix=T0, elapsed_s=125.0, duration_s=600.0, profile="tiny", phase="training",
        inject_bad_version=True,
        traffic={"sent": 125, "answered": 120, "failed": 5, "mixed": 0, "qps": 1.37, "latency_p50_s": 2.1,
                 "latency_p95_s": 5.3, "step_latency_p50_s": 0.42},
        heldout=heldout, train_reward=rewards,
        versions={"stable": "v1", "canary": "v3", "canary_percent": 25, "stable_reward": 0.62,
                  "canary_reward": 0.71, "stable_n": 40, "canary_n": 12, "latest_trained": "v4"},
        decisions=decisions,
        tool_use={"before": {"python": 0.6, "search,python": 0.1, "": 0.3}, "after": {"search,python": 0.7,
                                                                                     "python": 0.3}},
        examples=[{"query": "What is 2 + <b>3</b>?", "answer": "5", "expected": "5", "correct": True,
                   "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "trajectory_id": "traj-1", "version": "v1",
                   "tools": ["python"]},
                  {"query": "Capital of France?", "answer": "Lyon", "expected": "Paris", "correct": False,
                   "trace_id": "00f067aa0ba902b7a3ce929d0e0e4736", "trajectory_id": "traj-2", "version": "v2-bad",
                   "tools": ["search", "python"]}],
        trace_file="/tmp/agentflow-demo/traces.jsonl", otlp_endpoint="", out_dir="/tmp/agentflow-demo",
        summary={"heldout_before": 0.2, "heldout_after": 0.85, "promoted": 1, "rolled_back": 1,
                 "failed_production_queries": 5, "wall_s": 612.34567},
    )


def draw(state: dict, width: int = 100, height: int = 30) -> str:
    console = Console(record=True, width=width, height=height, color_system=None, file=open("/dev/null", "w"))
    console.print(render_dashboard(state))
    return console.export_text()


def test_dashboard_of_the_initial_state():
    text = draw(new_state(duration_s=600.0))
    for title in ("production traffic", "planner versions", "held-out success", "training reward",
                  "rollout decisions (0)"):
        assert title in text
    assert "phase starting" in text and "00:00 / 10:00" in text
    assert "no held-out evaluation yet" in text and "no rollout decision yet" in text
    assert "p50 – · p95 –" in text


def test_dashboard_shows_the_numbers():
    text = draw(rich_state())
    assert "profile tiny" in text and "phase training" in text and "02:05 / 10:00" in text
    assert "a bad version is injected" in text
    assert "1.37" in text and "120 / 125 sent" in text and "p50 2.10 s · p95 5.30 s" in text and "p50 0.42 s" in text
    assert "latest 0.85 (v3)" in text and "start 0.20" in text and "latest 0.70 (v4)" in text
    assert re.search(r"stable\s+v1\s+75%\s+0\.62\s+40", text)
    assert re.search(r"canary\s+v3\s+25%\s+0\.71\s+12", text)
    assert "latest trained: v4" in text
    assert re.search(r"01:35\s+rollback\s+v2-bad\s+0\s+reward fell <0.1>", text)
    assert text.index("rollback") < text.index("promote") < text.index("canary beats")  # newest first
    assert any(block in text for block in "▁▂▃▄▅▆▇█")


def test_dashboard_fits_small_terminals():
    for width, height in ((80, 24), (100, 30)):
        lines = draw(rich_state(), width, height).splitlines()
        assert len(lines) == height and max(len(line) for line in lines) <= width
        text = "\n".join(lines)
        assert "latest 0.85" in text and "rollback" in text and "latest trained: v4" in text
        assert "p95 5.30 s" in text


def test_dashboard_keeps_the_last_six_decisions():
    state = rich_state()
    state["decisions"] = [dict(state["decisions"][0], reason=f"reason {i}") for i in range(10)]
    text = draw(state)
    assert "reason 9" in text and "reason 4" in text and "reason 3" not in text


def _html_values(html_text: str) -> dict:
    return dict(re.findall(r'<span data-key="([\w.]+)">([^<]*)</span>', html_text))


def _json_at(data: dict, path: str):
    for part in path.split("."):
        data = data[part]
    return data


def assert_html_matches_json(shown: dict, data: dict) -> None:
    """Every tagged number of the page equals report.json at its path; every summary number is tagged."""
    assert {f"summary.{k}" for k in data["summary"]} <= set(shown)
    for path, text in shown.items():
        value = _json_at(data, path)
        if value is None:
            assert text == "n/a", path
        elif isinstance(value, (int, float)):
            assert float(text) == value, path
        else:
            assert text == value, path


def test_report_files_and_numbers(tmp_path):
    paths = write_report(rich_state(), tmp_path / "out")
    assert set(paths) == {"html", "json", "png", "svg"}
    for path in paths.values():
        assert (tmp_path / "out" / path.rsplit("/", 1)[-1]).stat().st_size > 500
    data = json.loads(open(paths["json"]).read())
    page = open(paths["html"], encoding="utf-8").read()
    shown = _html_values(page)
    assert_html_matches_json(shown, data)
    assert shown["summary.heldout_after"] == "0.85" and shown["summary.wall_s"] == "612.3457"
    assert shown["traffic.latency_p95_s"] == "5.3" and shown["versions.canary"] == "v3"
    assert "What is 2 + &lt;b&gt;3&lt;/b&gt;?" in page and "<b>3</b>" not in page  # escaped
    assert "reward fell &lt;0.1&gt;" in page and "canary_reward=0.05" in page
    trace_href = os.path.relpath("/tmp/agentflow-demo/traces.jsonl", tmp_path / "out")
    assert f'<a class="trace" href="{trace_href}#4bf92f3577b34da6a3ce929d0e0e4736">' \
        '4bf92f3577b34da6a3ce929d0e0e4736</a>' in page
    assert "/tmp/agentflow-demo/traces.jsonl" in page
    assert re.search(r"<code>search,python</code></td><td class=\"num\">10%</td><td class=\"num\">70%</td>", page)
    assert '<img src="reward_curves.png"' in page
    assert open(paths["png"], "rb").read(4) == b"\x89PNG"
    assert "<svg" in open(paths["svg"]).read()


def test_report_of_the_initial_state(tmp_path):
    paths = write_report(new_state(), tmp_path)
    data = json.loads(open(paths["json"]).read())
    page = open(paths["html"], encoding="utf-8").read()
    assert_html_matches_json(_html_values(page), data)
    assert _html_values(page)["summary.heldout_after"] == "n/a"
    assert "no rollout decision was made" in page and "tracing was not configured" in page


def test_the_report_gives_the_rollouts_lag_and_staleness(tmp_path):
    """From the trainer's step metrics: publication-to-first-rollout lags and trained turns by staleness."""
    from agentflow.demo.followers import count_rollouts

    state = new_state()
    count_rollouts(state["rollouts"], {"version_lags_s": [0.4, 2.0], "batch_turns_by_staleness": {"0": 3, "1": 5}})
    count_rollouts(state["rollouts"], {"version_lags_s": [0.3], "batch_turns_by_staleness": {"1": 1}})
    count_rollouts(state["rollouts"], {"skipped": True})
    data = json.loads(open(write_report(state, tmp_path)["json"]).read())
    assert data["rollouts"]["version_lag_p50_s"] == 0.4
    assert data["rollouts"]["trained_turns_by_staleness"] == {"0": 3, "1": 6}
