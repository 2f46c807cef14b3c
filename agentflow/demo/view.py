"""The view of `agentflow demo`: a live terminal dashboard (here) and the final report (report.py), both drawn from
one state dict.

The orchestrator (agentflow/demo/run.py) owns a JSON-able state dict and calls `render_dashboard(state)` on every
refresh and `report.write_report(state, out_dir)` once at the end. This module only reads the state. The contract: every
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

import time

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


def clock(seconds) -> str:
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
    text.append(f" · {clock(elapsed)} / {clock(duration)} {bar} {done:.0%}")
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
        table.add_row(clock(d["t_s"]), Text(d["action"], style=ACTION_STYLE.get(d["action"], "")),
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
