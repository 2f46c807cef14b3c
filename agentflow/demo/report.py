"""The final report of `agentflow demo` (``write_report``): report.json, report.html and the reward curves, from
the state dict whose contract agentflow/demo/view.py describes."""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path
from urllib.parse import quote

from agentflow.demo.view import clock

MARKED_ACTIONS = {"promote": "tab:green", "rollback": "tab:red"}  # vertical markers on the reward curves


def _rounded(value, digits: int = 4):
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def report_data(state: dict) -> dict:
    """What report.json holds and report.html shows (floats rounded to 4 digits)."""
    keys = ("profile", "phase", "started_unix", "duration_s", "inject_bad_version", "summary", "traffic", "versions",
            "decisions", "tool_use", "examples", "heldout", "train_reward", "unlabeled", "feedback", "rollouts")
    data = {k: state[k] for k in keys}
    data["traces"] = {"trace_file": state["trace_file"], "otlp_endpoint": state["otlp_endpoint"]}
    data["charts"] = {"png": "reward_curves.png", "svg": "reward_curves.svg"}
    return _rounded(data)


def _plot_curves(data: dict, png: Path, svg: Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend

    fig = Figure(figsize=(9, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    series = ((top, data["heldout"], "success", "held-out success", "tab:green"),
              (bottom, data["train_reward"], "reward", "training reward (batch mean)", "tab:blue"))
    for ax, points, key, label, color in series:
        ax.plot([p["t_s"] / 60 for p in points], [p[key] for p in points], marker="o", markersize=3,
                color=color, label=label)
        if not points:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="gray")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    top.set_ylim(-0.02, 1.02)
    for action, color in MARKED_ACTIONS.items():
        for i, d in enumerate(d for d in data["decisions"] if d["action"] == action):
            for ax in (top, bottom):
                ax.axvline(d["t_s"] / 60, color=color, linestyle="--", alpha=0.7,
                           label=f"{action} ({d['version']})" if i == 0 and ax is top else None)
    top.legend(loc="lower right", fontsize="small")
    bottom.set_xlabel("minutes since start")
    fig.suptitle(f"AgentFlow demo ({data['profile']}): held-out success and training reward")
    fig.savefig(png, dpi=110)
    fig.savefig(svg, metadata={"Date": None})


CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { color: #666; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8em; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6em 1em; min-width: 9em; }
.card .label { color: #666; font-size: 0.85em; } .card .value { font-size: 1.6em; font-weight: 600; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { border-bottom: 1px solid #eee; padding: 0.3em 0.5em; text-align: left; vertical-align: top; }
th { background: #f6f6f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.promote { color: #1a7f37; font-weight: 600; } .rollback, .reject { color: #cf222e; font-weight: 600; }
.ok { color: #1a7f37; } .bad { color: #cf222e; }
code { font-size: 0.85em; background: #f6f6f6; padding: 0 0.2em; word-break: break-all; }
img { max-width: 100%; border: 1px solid #eee; }
"""

SUMMARY_LABELS = (("heldout_before", "held-out success before"), ("heldout_after", "held-out success after"),
                  ("promoted", "versions promoted"), ("rolled_back", "versions rolled back"),
                  ("failed_production_queries", "failed production queries"), ("wall_s", "wall time (s)"))
TRAFFIC_LABELS = (("sent", "queries sent"), ("answered", "answered"), ("failed", "failed"),
                  ("mixed", "mixing versions"), ("qps", "queries/s"),
                  ("latency_p50_s", "latency p50 (s)"), ("latency_p95_s", "latency p95 (s)"),
                  ("step_latency_p50_s", "step latency p50 (s)"))
FEEDBACK_LABELS = (("sent", "ratings sent"), ("wrong", "of them wrong"), ("rated_share", "share of answers rated"),
                   ("rating_noise", "rating noise"), ("hostile_raters", "hostile raters"),
                   ("replayed", "training rollouts (replays)"),
                   ("opted_out_replayed", "replays of opted-out queries"))
VERSION_LABELS = (("stable", "stable"), ("canary", "canary"), ("canary_percent", "canary traffic %"),
                  ("stable_reward", "stable reward"), ("canary_reward", "canary reward"), ("stable_n", "stable n"),
                  ("canary_n", "canary n"), ("latest_trained", "latest trained"))


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _value(path: str, value) -> str:
    """A number of report.json, tagged with its path there (`data-key="summary.heldout_after"`)."""
    shown = "n/a" if value is None else json.dumps(value) if isinstance(value, (int, float)) else value
    return f'<span data-key="{_e(path)}">{_e(shown)}</span>'


def _cards(section: str, values: dict, labels) -> str:
    cards = "".join(f'<div class="card"><div class="label">{_e(label)}</div>'
                    f'<div class="value">{_value(f"{section}.{key}", values[key])}</div></div>'
                    for key, label in labels)
    return f'<div class="cards" id="{section}">{cards}</div>'


def _evidence(evidence: dict) -> str:
    return "<br>".join(f"<code>{_e(k)}={_e(json.dumps(v, sort_keys=True))}</code>" for k, v in evidence.items())


def _timeline(decisions: list[dict]) -> str:
    rows = "".join(f'<tr><td>{clock(d["t_s"])}</td><td class="{_e(d["action"])}">{_e(d["action"])}</td>'
                   f'<td>{_e(d["version"])}</td><td class="num">{_e(d["percent"])}</td><td>{_e(d["reason"])}</td>'
                   f'<td>{_evidence(d["evidence"])}</td></tr>' for d in decisions)
    rows = rows or '<tr><td colspan="6">no rollout decision was made</td></tr>'
    return ('<table id="timeline"><tr><th>time</th><th>action</th><th>version</th><th>% canary</th>'
            f'<th>reason</th><th>evidence</th></tr>{rows}</table>')


def _tool_use(tool_use: dict) -> str:
    before, after = tool_use["before"], tool_use["after"]
    sequences = sorted(set(before) | set(after), key=lambda s: (-after.get(s, 0), -before.get(s, 0), s))

    def share(value):
        return "–" if value is None else f"{value:.0%}"

    rows = "".join(f'<tr><td><code>{_e(s or "(no tool)")}</code></td><td class="num">{share(before.get(s))}</td>'
                   f'<td class="num">{share(after.get(s))}</td></tr>' for s in sequences)
    rows = rows or '<tr><td colspan="3">no tool use recorded</td></tr>'
    return f'<table id="tool-use"><tr><th>tool sequence</th><th>before</th><th>after</th></tr>{rows}</table>'


def _trace_link(trace_id: str, trace_file: str, out_dir: Path) -> str:
    if not trace_file:
        return f'<code class="trace">{_e(trace_id)}</code>'
    target = os.path.relpath(Path(trace_file).resolve(), out_dir.resolve())
    return f'<a class="trace" href="{_e(quote(target) + "#" + quote(trace_id))}">{_e(trace_id)}</a>'


def _examples(examples: list[dict], trace_file: str, out_dir: Path) -> str:
    rows = "".join(
        f'<tr><td>{_e(x["query"])}</td><td>{_e(x["answer"])}</td><td>{_e(x["expected"])}</td>'
        f'<td class="{"ok" if x["correct"] else "bad"}">{"✓" if x["correct"] else "✗"}</td>'
        f'<td>{_e(x["version"])}</td><td><code>{_e(" → ".join(x["tools"]) or "(none)")}</code></td>'
        f'<td>{_trace_link(x["trace_id"], trace_file, out_dir)}<br><small>trajectory {_e(x["trajectory_id"])}'
        f'</small></td></tr>' for x in examples)
    rows = rows or '<tr><td colspan="7">no example trajectory recorded</td></tr>'
    return ('<table id="examples"><tr><th>query</th><th>answer</th><th>expected</th><th></th><th>version</th>'
            f'<th>tools</th><th>trace</th></tr>{rows}</table>')


def _traces(traces: dict) -> str:
    parts = []
    if traces["trace_file"]:
        parts.append(f'spans are in the file <code id="trace-file">{_e(traces["trace_file"])}</code>')
    if traces["otlp_endpoint"]:
        parts.append(f'spans were exported over OTLP to <code id="otlp-endpoint">{_e(traces["otlp_endpoint"])}</code>')
    return "<p>" + ("; ".join(parts) or "tracing was not configured") + ". Find a query by its trace id.</p>"


def render_html(data: dict, out_dir: Path) -> str:
    """report.html from report_data() (the same dict report.json holds)."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(data["started_unix"]))
    bad = " · a bad planner version was injected" if data["inject_bad_version"] else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>AgentFlow demo report</title><style>{CSS}</style></head>
<body>
<h1>AgentFlow demo report</h1>
<p class="meta">profile <b>{_e(data["profile"])}</b> · phase <b>{_e(data["phase"])}</b> · started {_e(started)}
 · planned {_e(clock(data["duration_s"]))}{_e(bad)}</p>
<h2>Summary</h2>{_cards("summary", data["summary"], SUMMARY_LABELS)}
<h2>Reward curves</h2>
<p><img src="{_e(data["charts"]["png"])}" alt="held-out success and training reward over time"></p>
<p class="meta">vector version: <a href="{_e(data["charts"]["svg"])}">{_e(data["charts"]["svg"])}</a></p>
<h2>Production traffic</h2>{_cards("traffic", data["traffic"], TRAFFIC_LABELS)}
{_cards("feedback", data["feedback"], FEEDBACK_LABELS) if data.get("unlabeled") else ""}
<h2>Planner versions at the end</h2>{_cards("versions", data["versions"], VERSION_LABELS)}
<h2>Version timeline</h2>{_timeline(data["decisions"])}
<h2>Tool use before and after training</h2>{_tool_use(data["tool_use"])}
<h2>Example trajectories</h2>{_examples(data["examples"], data["traces"]["trace_file"], out_dir)}
<h2>Traces</h2>{_traces(data["traces"])}
</body></html>
"""


def write_report(state: dict, out_dir) -> dict:
    """Write report.json, then report.html from the same numbers, and the reward curves (PNG and SVG)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"html": out_dir / "report.html", "json": out_dir / "report.json",
             "png": out_dir / "reward_curves.png", "svg": out_dir / "reward_curves.svg"}
    paths["json"].write_text(json.dumps(report_data(state), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    data = json.loads(paths["json"].read_text(encoding="utf-8"))
    _plot_curves(data, paths["png"], paths["svg"])
    paths["html"].write_text(render_html(data, out_dir), encoding="utf-8")
    return {k: str(v) for k, v in paths.items()}
