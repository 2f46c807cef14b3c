"""The view of `agentflow demo`: a live terminal dashboard and the final report, both drawn from one state dict.

The orchestrator (agentflow/demo/run.py) owns a JSON-able state dict and calls `render_dashboard(state)` on every
refresh and `write_report(state, out_dir)` once at the end. This module only reads the state. The contract: every
key below is always present; lists may be empty; numbers may be None until they are known. `new_state()` builds one.

    started_unix: float        elapsed_s: float        duration_s: float
    profile: "tiny" | "smol"   phase: "starting" | "training" | "finishing" | "done" | "interrupted"
    inject_bad_version: bool
    traffic: {sent: int, answered: int, failed: int, mixed: int, qps: float,
              latency_p50_s: float|None, latency_p95_s: float|None, step_latency_p50_s: float|None,
              by_version: {version: {answered: int, correct: int}}}
    heldout: [{t_s: float, success: float, version: str}]
    train_reward: [{t_s: float, version: int, reward: float}]
    versions: {stable: str, canary: str|None, canary_percent: int, stable_reward: float|None,
               canary_reward: float|None, stable_n: int, canary_n: int, latest_trained: str}
    decisions: [{t_s: float, version: str, action: str, percent: int, reason: str, evidence: dict}]
               (action: canary | step | promote | rollback | reject)
    tool_use: {before: {tool sequence e.g. "search,python": share}, after: {...}}
    examples: [{query: str, answer: str, expected: str, correct: bool, trace_id: str, trajectory_id: str,
                version: str, tools: [str]}]
    trace_file: str            otlp_endpoint: str      out_dir: str
    summary: {heldout_before: float|None, heldout_after: float|None, promoted: int, rolled_back: int,
              failed_production_queries: int, wall_s: float}
    unlabeled: bool            (--unlabeled) feedback: {sent: int, failed: int, wrong: int, replayed: int,
                               opted_out_replayed: int, rated_share: float, rating_noise: float,
                               hostile_raters: float}
    rollouts: {version_lags_s: [float], version_lag_p50_s: float|None, trained_turns_by_staleness: {"0": int, ...}}
              (publication to the first training rollout of each version; the trained planner turns by staleness)

Times `t_s` are seconds since `started_unix`.
"""

from __future__ import annotations

import html
import json
import os
import time
from pathlib import Path
from urllib.parse import quote

from rich.console import Group
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

BLOCKS = " ▁▂▃▄▅▆▇█"
PHASE_STYLE = {"starting": "dim", "training": "bold green", "finishing": "yellow", "done": "bold green",
               "interrupted": "bold red"}
ACTION_STYLE = {"canary": "yellow", "step": "cyan", "promote": "bold green", "rollback": "bold red",
                "reject": "red"}
MARKED_ACTIONS = {"promote": "tab:green", "rollback": "tab:red"}  # vertical markers on the reward curves
DECISIONS_SHOWN = 6


def new_state(**overrides) -> dict:
    """A state with every key of the contract present, before anything is known."""
    state = {
        "started_unix": time.time(), "elapsed_s": 0.0, "duration_s": 0.0, "profile": "tiny", "phase": "starting",
        "inject_bad_version": False,
        "traffic": {"sent": 0, "answered": 0, "failed": 0, "mixed": 0, "qps": 0.0, "latency_p50_s": None,
                    "latency_p95_s": None, "step_latency_p50_s": None, "by_version": {}},
        "heldout": [], "train_reward": [], "unlabeled": False, "feedback": {},
        "rollouts": {"version_lags_s": [], "version_lag_p50_s": None, "trained_turns_by_staleness": {}},
        "versions": {"stable": "", "canary": None, "canary_percent": 0, "stable_reward": None,
                     "canary_reward": None, "stable_n": 0, "canary_n": 0, "latest_trained": ""},
        "decisions": [], "tool_use": {"before": {}, "after": {}}, "examples": [],
        "trace_file": "", "otlp_endpoint": "", "out_dir": "",
        "summary": {"heldout_before": None, "heldout_after": None, "promoted": 0, "rolled_back": 0,
                    "failed_production_queries": 0, "wall_s": 0.0},
    }
    state.update(overrides)
    return state


# --- formatting ----------------------------------------------------------------------------------------------------

def _num(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _secs(value) -> str:
    return "–" if value is None else f"{value:.2f} s"


def _clock(seconds) -> str:
    seconds = int(seconds or 0)
    return f"{seconds // 60:02d}:{seconds % 60:02d}"


# --- the dashboard -------------------------------------------------------------------------------------------------

class Sparkline:
    """A bar chart of the latest values in unicode blocks, as wide and (inside a Layout) as tall as it is given.

    The last line is a caption with the latest value; without a given height the chart is 3 lines tall."""

    def __init__(self, values: list[float], caption: str, style: str, lo: float = 0.0, hi: float = 1.0):
        self.values, self.caption, self.style = values, caption, style
        self.lo, self.hi = lo, max(hi, lo + 1e-9)

    def __rich_console__(self, console, options):
        rows = max(1, (options.height or 4) - 1)
        values = self.values[-options.max_width:]
        bar_width = max(1, min(3, options.max_width // max(1, len(values))))  # few values: wider bars
        levels = [max(1, round((v - self.lo) / (self.hi - self.lo) * rows * 8)) for v in values]
        for row in range(rows - 1, -1, -1):
            line = "".join(BLOCKS[min(8, max(0, level - row * 8))] * bar_width for level in levels)
            yield Text(line or " ", style=self.style, no_wrap=True)
        caption = Text(self.caption, no_wrap=True, overflow="ellipsis", style="" if values else "dim")
        caption.truncate(options.max_width, overflow="ellipsis")
        yield caption


def _header(state: dict) -> Text:
    duration, elapsed = state["duration_s"] or 0, state["elapsed_s"] or 0
    done = min(1.0, elapsed / duration) if duration else 0.0
    bar = "█" * round(done * 10) + "░" * (10 - round(done * 10))
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(" AgentFlow demo ", style="bold reverse")
    text.append(f" profile {state['profile']} · phase ")
    text.append(state["phase"], style=PHASE_STYLE.get(state["phase"], ""))
    text.append(f" · {_clock(elapsed)} / {_clock(duration)} {bar} {done:.0%}")
    return text


def _traffic_panel(traffic: dict) -> Panel:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(no_wrap=True, overflow="ellipsis")
    grid.add_row("queries/s", _num(traffic["qps"]))
    grid.add_row("answered", f"{traffic['answered']} / {traffic['sent']} sent")
    grid.add_row("failed", Text(str(traffic["failed"]), style="red" if traffic["failed"] else "green"))
    grid.add_row("latency", f"p50 {_secs(traffic['latency_p50_s'])} · p95 {_secs(traffic['latency_p95_s'])}")
    grid.add_row("step", f"p50 {_secs(traffic['step_latency_p50_s'])}")
    return Panel(grid, title="production traffic", border_style="blue")


def _versions_panel(versions: dict, inject_bad_version: bool) -> Panel:
    table = Table(box=None, padding=(0, 1), collapse_padding=True, pad_edge=False, expand=True, header_style="bold")
    table.add_column("arm", no_wrap=True)
    table.add_column("version", no_wrap=True, overflow="ellipsis", ratio=1)
    table.add_column("split", justify="right", no_wrap=True)
    table.add_column("reward", justify="right", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    canary, percent = versions["canary"], versions["canary_percent"] if versions["canary"] else 0
    table.add_row("stable", versions["stable"] or "–", f"{100 - percent}%", _num(versions["stable_reward"]),
                  str(versions["stable_n"]))
    if canary:
        table.add_row(Text("canary", style="yellow"), canary, f"{percent}%", _num(versions["canary_reward"]),
                      str(versions["canary_n"]))
    else:
        table.add_row(Text("canary", style="dim"), Text("none", style="dim"), "", "", "")
    latest = Text(f"latest trained: {versions['latest_trained'] or '–'}", no_wrap=True, overflow="ellipsis")
    subtitle = Text("a bad version is injected", style="red") if inject_bad_version else None
    return Panel(Group(table, latest), title="planner versions", subtitle=subtitle, border_style="magenta")


def _heldout_panel(points: list[dict]) -> Panel:
    values = [p["success"] for p in points]
    caption = (f"latest {values[-1]:.2f} ({points[-1]['version']}) · start {values[0]:.2f} · {len(values)} evals"
               if values else "no held-out evaluation yet")
    return Panel(Sparkline(values, caption, "green"), title="held-out success", border_style="green")


def _reward_panel(points: list[dict]) -> Panel:
    values = [p["reward"] for p in points]
    caption = (f"latest {values[-1]:.2f} (v{points[-1]['version']}) · {len(values)} steps"
               if values else "no training step yet")
    lo, hi = min([0.0, *values]), max([1.0, *values])
    return Panel(Sparkline(values, caption, "cyan", lo, hi), title="training reward", border_style="cyan")


def _decisions_panel(decisions: list[dict]) -> Panel:
    title = f"rollout decisions ({len(decisions)})"
    if not decisions:
        return Panel(Text("no rollout decision yet", style="dim"), title=title, border_style="yellow")
    table = Table(box=None, padding=(0, 1), collapse_padding=True, pad_edge=False, expand=True,
                  header_style="bold")
    for name, justify in (("time", "left"), ("action", "left"), ("version", "left"), ("%", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    table.add_column("reason", no_wrap=True, overflow="ellipsis", ratio=1)
    for d in reversed(decisions[-DECISIONS_SHOWN:]):  # newest first: a short panel crops the oldest
        table.add_row(_clock(d["t_s"]), Text(d["action"], style=ACTION_STYLE.get(d["action"], "")),
                      str(d["version"]), str(d["percent"]), d["reason"])
    return Panel(table, title=title + " · newest first", border_style="yellow")


def render_dashboard(state: dict) -> Layout:
    """The live dashboard: fills the console it is drawn on (fits 80x24 and up)."""
    layout = Layout(name="dashboard")
    layout.split_column(Layout(_header(state), name="header", size=1),
                        Layout(name="middle", minimum_size=14),
                        Layout(_decisions_panel(state["decisions"]), name="decisions", size=3 + DECISIONS_SHOWN))
    layout["middle"].split_row(Layout(name="left"), Layout(name="right"))
    layout["left"].split_column(Layout(_traffic_panel(state["traffic"])),
                                Layout(_versions_panel(state["versions"], state["inject_bad_version"])))
    layout["right"].split_column(Layout(_heldout_panel(state["heldout"])),
                                 Layout(_reward_panel(state["train_reward"])))
    return layout


# --- the report ----------------------------------------------------------------------------------------------------

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
    rows = "".join(f'<tr><td>{_clock(d["t_s"])}</td><td class="{_e(d["action"])}">{_e(d["action"])}</td>'
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
 · planned {_e(_clock(data["duration_s"]))}{_e(bad)}</p>
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
