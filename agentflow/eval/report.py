"""Markdown and self-contained HTML reports of a run, with PNG plots, drawn from the summary dict alone.

Every number in the HTML sits in an element with ``data-metric="<dotted path in summary.json>"`` and
``data-value="<the JSON value>"``, so a browser check can compare the page with the summary. The plots are PNGs in
``plots/`` beside the reports, embedded in the HTML as data URIs (the page needs no other file and no network).
The HTML also holds a table of every item with its trajectory, drawn from the result rows
(``agentflow.eval.items_report``).
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

PLOTS = ("outcomes", "turns", "tools", "latency")
_COLOURS = {"correct": "#2e7d32", "wrong": "#c62828", "error": "#757575", "calls": "#1565c0", "errors": "#ef6c00"}


# --- formatting ----------------------------------------------------------------------------------------------------
def lookup(summary: dict, path: str):
    """The value at a dotted ``path`` in ``summary`` (``"tools.per_tool.python.calls"``); KeyError when absent."""
    value = summary
    for part in path.split("."):
        value = value[part]
    return value


def fmt(value, kind: str = "num") -> str:
    """How a metric is shown: ``pct`` as a percentage with one decimal, ``s`` as seconds with two decimals,
    ``int`` with thousands separators, ``num`` with up to three decimals; None as an em dash."""
    if value is None:
        return "—"
    if kind == "pct":
        return f"{value * 100:.1f}%"
    if kind == "s":
        return f"{value:.2f} s"
    if kind == "int":
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value)}"
    return str(value)


def _metric_rows(summary: dict) -> list[tuple[str, str, str]]:
    """(label, dotted path, format) of the headline metrics, in display order."""
    rows = [
        ("Accuracy", "accuracy", "pct"),
        ("Correct", "correct", "int"),
        ("Items finished", "items.finished", "int"),
        ("Items selected", "items.selected", "int"),
        ("Items not run", "items.not_run", "int"),
        ("Item errors", "items.errors", "int"),
        ("Mean turns", "turns.mean", "num"),
        ("Median turns", "turns.median", "num"),
        ("Latency p50", "latency_s.p50", "s"),
        ("Latency p95", "latency_s.p95", "s"),
        ("Prompt tokens", "tokens.prompt", "int"),
        ("Completion tokens", "tokens.completion", "int"),
        ("Tokens per item", "tokens.mean_per_item", "num"),
        ("Tool calls", "tools.calls", "int"),
        ("Tool-error rate", "tools.error_rate", "pct"),
        ("Planner parse-error rate", "parse_errors.planner_rate", "pct"),
        ("Run wall time", "run.wall_s", "s"),
        ("Throughput (items/min)", "throughput_items_per_min", "num"),
    ]
    if summary["items"].get("judged"):
        rows.insert(2, ("Judged by the LLM judge", "items.judged", "int"))
    return rows


def _ci_text(summary: dict) -> str:
    ci = summary.get("accuracy_ci95")
    return "" if not ci else f"95% CI {ci[0] * 100:.1f}–{ci[1] * 100:.1f}%"


# --- plots ---------------------------------------------------------------------------------------------------------
def make_plots(summary: dict) -> dict[str, bytes]:
    """PNG bytes of each plot in PLOTS (matplotlib's object API with the Agg canvas: thread-safe, no display)."""
    from matplotlib.figure import Figure

    def png(fig) -> bytes:
        buffer = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()

    out = {}
    items = summary["items"]
    correct, errors = summary["correct"], items["errors"]
    wrong = max(0, items["finished"] - correct - errors)
    fig = Figure(figsize=(5.5, 2.8))
    ax = fig.subplots()
    labels, values = ["correct", "wrong", "failed", "not run"], [correct, wrong, errors, items["not_run"]]
    bars = ax.barh(labels, values, color=[_COLOURS["correct"], _COLOURS["wrong"], _COLOURS["errors"],
                                          _COLOURS["error"]])
    ax.bar_label(bars, padding=3)
    ax.invert_yaxis()
    ax.set_xlabel("items")
    accuracy = summary["accuracy"]
    ax.set_title(f"outcomes (accuracy {fmt(accuracy, 'pct')})")
    ax.set_xlim(0, max(values + [1]) * 1.15)
    out["outcomes"] = png(fig)

    fig = Figure(figsize=(5.5, 3.0))
    ax = fig.subplots()
    hist = summary["turns"]["histogram"]
    keys = list(hist)
    right = [hist[k]["correct"] for k in keys]
    rest = [hist[k]["items"] - hist[k]["correct"] for k in keys]
    ax.bar(keys, right, color=_COLOURS["correct"], label="correct")
    ax.bar(keys, rest, bottom=right, color=_COLOURS["wrong"], label="wrong")
    ax.set_xlabel("planner turns")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("items")
    ax.set_title("turns per item")
    if keys:
        ax.legend()
    out["turns"] = png(fig)

    fig = Figure(figsize=(5.5, 3.0))
    ax = fig.subplots()
    per_tool = summary["tools"]["per_tool"]
    names = list(per_tool)
    ok = [per_tool[n]["calls"] - per_tool[n]["errors"] for n in names]
    failed = [per_tool[n]["errors"] for n in names]
    ax.bar(names, ok, color=_COLOURS["calls"], label="succeeded")
    ax.bar(names, failed, bottom=ok, color=_COLOURS["errors"], label="failed")
    ax.set_ylabel("calls")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_title(f"tool calls (error rate {fmt(summary['tools']['error_rate'], 'pct')})")
    if names:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no tool calls", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    out["tools"] = png(fig)

    fig = Figure(figsize=(5.5, 3.0))
    ax = fig.subplots()
    latency = summary["latency_s"]
    edges, counts = latency["histogram"]["edges"], latency["histogram"]["counts"]
    if counts:
        ax.bar(edges[:-1], counts, width=[b - a for a, b in zip(edges, edges[1:])], align="edge",
               color=_COLOURS["calls"], edgecolor="white")
        for name, style in (("p50", "--"), ("p95", ":")):
            if latency[name] is not None:
                ax.axvline(latency[name], color="black", linestyle=style, label=f"{name} {latency[name]:.1f} s")
        ax.legend()
    ax.set_xlabel("seconds per item")
    ax.set_ylabel("items")
    ax.set_title("latency")
    out["latency"] = png(fig)
    return out


# --- Markdown ------------------------------------------------------------------------------------------------------
def render_markdown(summary: dict, plot_dir: str = "plots") -> str:
    run = summary["run"]
    lines = [f"# Evaluation: {Path(run.get('data', '?')).name} ({run.get('kind', '?')})", ""]
    if run.get("interrupted"):
        lines += ["> **Interrupted**: only the items that finished are counted.", ""]
    lines += [_run_line(run), "", "| metric | value |", "|---|---|"]
    for label, path, kind in _metric_rows(summary):
        value = fmt(lookup(summary, path), kind)
        if path == "accuracy" and _ci_text(summary):
            value += f" ({_ci_text(summary)})"
        lines.append(f"| {label} | {value} |")
    lines += ["", "## Status", "", "| status | items |", "|---|---|"]
    lines += [f"| {status} | {count} |" for status, count in summary["status_counts"].items()]
    lines += ["", "## Tools", "", "| tool | calls | errors | error rate |", "|---|---|---|---|"]
    for name, stats in summary["tools"]["per_tool"].items():
        lines.append(f"| {name} | {stats['calls']} | {stats['errors']} | {fmt(stats['error_rate'], 'pct')} |")
    lines += ["", "## Plots", ""]
    lines += [f"![{name}]({plot_dir}/{name}.png)" for name in PLOTS]
    return "\n".join(lines) + "\n"


def _run_line(run: dict) -> str:
    parts = [f"data `{run.get('data', '?')}`", f"kind `{run.get('kind', '?')}`"]
    for key, label in (("engine", "engine"), ("model", "model"), ("max_steps", "max steps"),
                       ("max_time_s", "max time (s)"), ("concurrency", "concurrency"), ("judge", "judge")):
        if run.get(key) not in (None, ""):
            parts.append(f"{label} `{run[key]}`")
    return " · ".join(parts)


# --- HTML ----------------------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:64rem;color:#222;
padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #ccc;padding:.3rem .7rem;text-align:left}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums}
.headline{font-size:2.4rem;font-weight:600}.muted{color:#666}.warn{background:#fff3cd;padding:.5rem 1rem}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(26rem,1fr));gap:1rem}.plots img{max-width:100%}
code{background:#f3f3f3;padding:0 .2rem}
"""
# Marks the page once every embedded plot has decoded: a headless browser check reads data-plots-loaded.
_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img.plot'), ok = 0;
  imgs.forEach(function (img) { if (img.complete && img.naturalWidth > 0) ok++; });
  document.body.setAttribute('data-plots-loaded', ok + '/' + imgs.length);
});
"""


def _cell(summary: dict, path: str, kind: str, tag: str = "td", css: str = "num") -> str:
    value = lookup(summary, path)
    return (f'<{tag} class="{css}" data-metric="{html.escape(path)}" '
            f'data-value="{html.escape(json.dumps(value))}">{html.escape(fmt(value, kind))}</{tag}>')


def render_html(summary: dict, plots: dict[str, bytes], rows: list[dict] | None = None) -> str:
    """The report page; ``rows`` (the run's ``results.jsonl`` rows) add the item table and trajectories."""
    from agentflow.eval.items_report import CSS as ITEMS_CSS, SCRIPT as ITEMS_SCRIPT, render_items

    run = summary["run"]
    esc = html.escape
    title = f"Evaluation: {Path(run.get('data', '?')).name} ({run.get('kind', '?')})"
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{esc(title)}</title><style>{_CSS}{ITEMS_CSS}</style></head><body>", f"<h1>{esc(title)}</h1>"]
    if run.get("interrupted"):
        parts.append('<p class="warn"><strong>Interrupted</strong>: only the items that finished are counted.</p>')
    parts.append(f'<p>{_cell(summary, "accuracy", "pct", "span", "headline")} '
                 f'<span class="muted">({_cell(summary, "correct", "int", "span", "")} of '
                 f'{_cell(summary, "items.finished", "int", "span", "")} items; {esc(_ci_text(summary))})</span></p>')
    parts.append(f'<p class="muted">{_run_html(run)}</p>')
    parts.append('<h2>Metrics</h2><table id="metrics"><tr><th>metric</th><th>value</th></tr>')
    for label, path, kind in _metric_rows(summary):
        parts.append(f"<tr><td>{esc(label)}</td>{_cell(summary, path, kind)}</tr>")
    parts.append("</table>")
    parts.append('<h2>Status</h2><table id="status"><tr><th>status</th><th>items</th></tr>')
    for status in summary["status_counts"]:
        parts.append(f"<tr><td>{esc(status)}</td>{_cell(summary, f'status_counts.{status}', 'int')}</tr>")
    parts.append("</table>")
    parts.append('<h2>Tools</h2><table id="tools"><tr><th>tool</th><th>calls</th><th>errors</th>'
                 "<th>error rate</th></tr>")
    for name in summary["tools"]["per_tool"]:
        base = f"tools.per_tool.{name}"
        parts.append(f"<tr><td>{esc(name)}</td>{_cell(summary, base + '.calls', 'int')}"
                     f"{_cell(summary, base + '.errors', 'int')}{_cell(summary, base + '.error_rate', 'pct')}</tr>")
    parts.append(f"<tr><td><em>all</em></td>{_cell(summary, 'tools.calls', 'int')}"
                 f"{_cell(summary, 'tools.errors', 'int')}{_cell(summary, 'tools.error_rate', 'pct')}</tr></table>")
    parts.append('<h2>Plots</h2><div class="plots">')
    for name in PLOTS:
        if name in plots:
            data = base64.b64encode(plots[name]).decode("ascii")
            parts.append(f'<img class="plot" id="plot-{name}" alt="{name}" src="data:image/png;base64,{data}">')
    parts.append("</div>")
    if rows:
        parts.append(render_items(rows))
    parts.append(f'<p class="muted">schema {esc(summary.get("schema", ""))}; every number above comes from '
                 f"<code>summary.json</code>.</p>")
    parts.append(f"<script>{_SCRIPT}{ITEMS_SCRIPT if rows else ''}</script></body></html>")
    return "\n".join(parts) + "\n"


def _run_html(run: dict) -> str:
    return " · ".join(html.escape(part.replace("`", "")) for part in _run_line(run).split(" · "))


def write_reports(summary: dict, out_dir: Path, rows: list[dict] | None = None) -> dict[str, Path]:
    """Write ``plots/*.png``, ``report.md`` and ``report.html`` into ``out_dir``; returns their paths. The HTML's item
    table comes from ``rows``, by default the ``results.jsonl`` in ``out_dir`` (none when it is absent)."""
    out_dir = Path(out_dir)
    if rows is None:
        rows = _results_beside(out_dir)
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    plots = make_plots(summary)
    paths = {}
    for name, data in plots.items():
        (plot_dir / f"{name}.png").write_bytes(data)
        paths[f"plot_{name}"] = plot_dir / f"{name}.png"
    paths["markdown"] = out_dir / "report.md"
    paths["markdown"].write_text(render_markdown(summary), encoding="utf-8")
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(render_html(summary, plots, rows), encoding="utf-8")
    return paths


def _results_beside(out_dir: Path) -> list[dict]:
    from agentflow.eval.items import read_results
    from agentflow.eval.runner import RESULTS_FILE

    path = out_dir / RESULTS_FILE
    return read_results(path) if path.is_file() else []
