"""Readable, step-by-step terminal output of one query (rich)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

VERDICT_STYLE = {"STOP": "bold green", "CONTINUE": "yellow", "": "dim"}
DOING = {"planner": "planning", "executor": "writing and running the command", "verifier": "checking the memory",
         "generator": "writing the answer"}


class Stage:
    """What the agent is doing now, with its seconds so far (redrawn by rich while it runs)."""

    def __init__(self, payload: dict):
        self.since = time.monotonic()
        module, step, tool = payload["module"], payload.get("step", 0), payload.get("tool", "")
        where = "analysing the query" if module == "planner" and step == 0 else DOING.get(module, "working")
        self.label = " · ".join(part for part in (f"step {step}" if step and module != "generator" else "",
                                                  f"{module}: {where}" + (f" ({tool})" if tool else "")) if part)

    def __rich__(self) -> Text:
        return Text(f"{self.label} … {time.monotonic() - self.since:.0f} s", style="dim")


class TracePrinter:
    """Prints a query's steps as they finish; in a terminal a status line shows the module at work meanwhile,
    elsewhere one line per stage."""

    def __init__(self, stream=None):
        self.console = Console(file=stream or sys.stdout, highlight=False, soft_wrap=False)
        self._live = None

    def close(self) -> None:
        """Remove the status line (idempotent)."""
        if self._live is not None:
            self._live.stop()
            self._live = None

    def status(self, message: str) -> None:
        self.console.print(Text(message, style="dim"))

    def query(self, query: str, tools: list[str], loop) -> None:
        self.console.print(Panel(Text(query), title="query", subtitle=f"tools: {', '.join(tools)} · "
                                 f"max {loop.max_steps} steps · {loop.max_time_s:g} s", border_style="cyan"))

    def event(self, stage: str, payload: dict) -> None:
        if stage == "stage":
            self._stage(Stage(payload))
            return
        self.close()
        if stage == "analysis":
            self.console.print(Panel(Text(payload["analysis"] or "(empty)"), title="analysis", border_style="blue"))
        elif stage == "turn":
            self.console.print(self._turn(payload))

    def _stage(self, stage: Stage) -> None:
        if not self.console.is_terminal:
            self.console.print(Text(f"… {stage.label}", style="dim"))
        elif self._live is None:
            self._live = self.console.status(stage)
            self._live.start()
        else:
            self._live.update(stage)

    def _turn(self, turn: dict) -> Panel:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        decision = turn["decision"]
        if turn["parse_error"]:
            grid.add_row("plan", Text(f"unreadable: {turn['parse_error']}", style="red"))
        elif decision["tool"]:
            grid.add_row("sub-goal", Text(decision["sub_goal"]))
            grid.add_row("tool", Text(decision["tool"], style="magenta"))
            if turn["command"]:
                grid.add_row("command", Text(_clip(turn["command"], 600)))
            if turn["tool_error"]:
                grid.add_row("error", Text(_clip(turn["tool_error"], 400), style="red"))
            elif turn["command"]:
                grid.add_row("result", Text(_clip(turn["result"], 600)))
        if not turn["verdict"] and not turn["parse_error"]:
            grid.add_row("stopped", Text("the time budget ran out during this step", style="yellow"))
        if turn["verdict"]:
            grid.add_row("verifier", Text(f"{turn['verdict']} · {_clip(turn['verifier_analysis'], 300)}",
                                          style=VERDICT_STYLE.get(turn["verdict"], "")))
        timings = turn["timings"]
        return Panel(grid, title=f"step {turn['step'] + 1}", subtitle=f"{timings['total_s']:.1f} s", border_style="white")

    def record(self, record: dict) -> None:
        """A whole finished trajectory: its query and id, the analysis, every turn and the answer."""
        subtitle = " · ".join(part for part in (record.get("trajectory_id", ""), record.get("source", ""),
                                                  record.get("status", "")) if part)
        self.console.print(Panel(Text(record.get("query", "")), title="query", subtitle=subtitle,
                                 border_style="cyan"))
        if record.get("analysis"):
            self.event("analysis", {"analysis": record["analysis"]})
        for turn in record.get("turns", []):
            self.event("turn", turn)
        if record.get("error"):
            self.console.print(Text(f"error: {record['error']}", style="red"))
        self.summary(record)

    def summary(self, record: dict) -> None:
        self.close()
        totals = record["totals"]
        style = "green" if record["status"] == "answered" else "yellow"
        self.console.print(Panel(Text(record["answer"] or "(no answer)", style="bold"),
                                 title=f"answer · {record['status']}", border_style=style,
                                 subtitle=f"{totals['turns']} turns · {totals['prompt_tokens']}+"
                                          f"{totals['completion_tokens']} tokens · {totals['latency_s']:.1f} s"))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " …"
