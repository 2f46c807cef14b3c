"""The report's item table: every item of a run (question, gold answer, prediction, correct, status, turns, tools,
error, latency), sortable and filterable by a small inline script, and each item's trajectory in a side panel.

Every string from the data is HTML-escaped (questions and tool outputs are untrusted) and the script only moves,
hides and shows elements, never writes markup. Texts are clipped (``agentflow.eval.items``), and at most
TRAJECTORY_ITEMS_LIMIT trajectories are embedded, so the page stays bounded for large runs.
"""

from __future__ import annotations

import html
import json

from agentflow.eval.items import STEP_TEXT_LIMIT, TABLE_TEXT_LIMIT, clip, gold_text, item_rows, trajectory_steps

TRAJECTORY_ITEMS_LIMIT = 1000  # items whose trajectory the page embeds (the first ones, in item order)

# (column key, header, sort type); the last column opens the trajectory and does not sort.
COLUMNS = (("index", "#", "num"), ("question", "question", "text"), ("gold", "gold answer", "text"),
           ("prediction", "prediction", "text"), ("correct", "correct", "num"), ("status", "status", "text"),
           ("turns", "turns", "num"), ("tools", "tools", "text"), ("error", "error", "text"),
           ("latency_s", "latency (s)", "num"))

CSS = """
.items-wrap{overflow-x:auto}#items{font-size:.85rem}#items td{vertical-align:top;max-width:18rem;
overflow-wrap:anywhere}#items th[data-sort]{cursor:pointer;user-select:none;white-space:nowrap}
#items th[aria-sort=ascending]::after{content:" \\25B2"}#items th[aria-sort=descending]::after{content:" \\25BC"}
#items tr.selected td{background:#e3f2fd}.yes{color:#2e7d32;font-weight:600}.no{color:#c62828}
.filters{display:flex;gap:.6rem;align-items:center;flex-wrap:wrap;margin:.5rem 0}#item-filter{min-width:18rem}
#trajectory-panel{position:fixed;top:0;right:0;bottom:0;width:min(44rem,60vw);overflow:auto;background:#fff;
border-left:1px solid #bbb;box-shadow:-4px 0 12px rgba(0,0,0,.15);padding:1rem 1.2rem;z-index:10}
#panel-close{float:right}.trajectory pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f7;
padding:.3rem .4rem;margin:0;font-size:.85rem}.trajectory dl{display:grid;grid-template-columns:9rem 1fr;
gap:.3rem .6rem}.trajectory dt{font-weight:600}.trajectory dd{margin:0;min-width:0}
ol.steps{list-style:none;padding:0}.step{border:1px solid #ddd;padding:.4rem .8rem;margin:.6rem 0}
.verdict-STOP{color:#2e7d32;font-weight:600}
.verdict-CONTINUE{color:#ef6c00;font-weight:600}.err{color:#c62828}
"""

# Sort on a header click (numbers by data-value, texts case-folded, ties by item order), filter by text, status
# and correctness, and show one trajectory in the side panel. It never builds markup from the data.
SCRIPT = """
(function () {
  var table = document.getElementById('items');
  if (!table) return;
  var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
  var text = document.getElementById('item-filter'), status = document.getElementById('item-status');
  var correct = document.getElementById('item-correct'), count = document.getElementById('item-count');
  var panel = document.getElementById('trajectory-panel');
  var haystack = rows.map(function (row) {
    return Array.prototype.map.call(row.querySelectorAll('td[data-col]'), function (td) {
      return td.textContent; }).join(' ').toLowerCase();
  });
  rows.forEach(function (row, i) { row.haystack = haystack[i]; });
  function key(row, col, type) {
    var td = row.querySelector('td[data-col="' + col + '"]');
    if (type !== 'num') return td.textContent.toLowerCase();
    var v = parseFloat(td.getAttribute('data-value'));
    return isNaN(v) ? -Infinity : v;
  }
  table.tHead.addEventListener('click', function (event) {
    var th = event.target.closest('th[data-sort]');
    if (!th) return;
    var dir = th.getAttribute('aria-sort') === 'ascending' ? 'descending' : 'ascending';
    var sign = dir === 'ascending' ? 1 : -1;
    table.querySelectorAll('th[data-sort]').forEach(function (h) { h.removeAttribute('aria-sort'); });
    th.setAttribute('aria-sort', dir);
    var col = th.getAttribute('data-sort'), type = th.getAttribute('data-type');
    rows.sort(function (a, b) {
      var x = key(a, col, type), y = key(b, col, type);
      return (x < y ? -sign : x > y ? sign : 0) || (a.getAttribute('data-index') - b.getAttribute('data-index'));
    });
    rows.forEach(function (row) { body.appendChild(row); });
  });
  function filter() {
    var q = text.value.trim().toLowerCase(), s = status.value, c = correct.value, shown = 0;
    rows.forEach(function (row) {
      var ok = (!q || row.haystack.indexOf(q) >= 0) && (!s || row.getAttribute('data-status') === s) &&
               (!c || row.getAttribute('data-correct') === c);
      row.hidden = !ok;
      shown += ok ? 1 : 0;
    });
    count.textContent = shown + ' of ' + rows.length + ' items';
  }
  [text, status, correct].forEach(function (el) {
    el.addEventListener('input', filter);
    el.addEventListener('change', filter);
  });
  function close() {
    panel.hidden = true;
    rows.forEach(function (row) { row.classList.remove('selected'); });
  }
  body.addEventListener('click', function (event) {
    var button = event.target.closest('button.view');
    if (!button) return;
    panel.querySelectorAll('article.trajectory').forEach(function (a) { a.hidden = true; });
    document.getElementById(button.getAttribute('data-target')).hidden = false;
    rows.forEach(function (row) { row.classList.toggle('selected', row.contains(button)); });
    panel.hidden = false;
  });
  document.getElementById('panel-close').addEventListener('click', close);
  document.addEventListener('keydown', function (event) { if (event.key === 'Escape') close(); });
  filter();
})();
"""

_esc = html.escape


def _cell(col: str, text: str, value=None, css: str = "") -> str:
    attrs = f' data-col="{col}"'
    if value is not None:
        attrs += f' data-value="{_esc(json.dumps(value))}"'
    if css:
        attrs += f' class="{css}"'
    return f"<td{attrs}>{_esc(text)}</td>"


def _table_row(row: dict, with_trajectory: bool) -> str:
    correct = row["correct"]
    latency = row["latency_s"]
    cells = [
        _cell("index", str(row["index"]), row["index"], "num"),
        _cell("question", row["question"]), _cell("gold", row["gold"]), _cell("prediction", row["prediction"]),
        _cell("correct", "yes" if correct else "no", int(correct), "yes" if correct else "no"),
        _cell("status", row["status"]), _cell("turns", str(row["turns"]), row["turns"], "num"),
        _cell("tools", ", ".join(row["tools"])), _cell("error", row["error"], css="err" if row["error"] else ""),
        _cell("latency_s", "—" if latency is None else f"{latency:.2f}", latency, "num"),
    ]
    if with_trajectory:
        cells.append(f'<td><button class="view" type="button" data-target="traj-{row["index"]}">steps</button></td>')
    else:
        cells.append('<td class="muted" title="not embedded: see agentflow trace show">—</td>')
    return (f'<tr class="item" data-index="{_esc(str(row["index"]))}" data-pid="{_esc(row["pid"])}" '
            f'data-correct="{"true" if correct else "false"}" data-status="{_esc(row["status"])}" '
            f'data-trajectory-id="{_esc(row["trajectory_id"])}">{"".join(cells)}</tr>')


def _dl(pairs: list[tuple[str, str, str]]) -> str:
    """A definition list of (term, text, css) with texts in <pre>; empty texts are left out."""
    items = [f'<dt>{_esc(term)}</dt><dd><pre class="{css}">{_esc(text)}</pre></dd>'
             for term, text, css in pairs if text]
    return f"<dl>{''.join(items)}</dl>" if items else ""


def _step_html(step: dict) -> str:
    if step["parse_error"]:
        plan = [("plan unreadable", step["parse_error"], "err")]
    else:
        plan = [("sub-goal", step["sub_goal"], ""), ("tool", step["tool"], ""), ("context", step["context"], ""),
                ("tool input", step["command"], ""), ("tool output", step["result"], ""),
                ("tool error", step["tool_error"], "err")]
    verdict = step["verdict"] or "none (the turn was cut short)"
    seconds = "" if step["seconds"] is None else f" · {step['seconds']:.2f} s"
    return (f'<li class="step" data-step="{step["step"]}"><strong>step {step["step"]}</strong>'
            f'<span class="muted">{_esc(seconds)}</span>{_dl(plan)}'
            f'<p>verifier: <span class="verdict verdict-{_esc(step["verdict"] or "none")}">{_esc(verdict)}</span>'
            f'</p>{_dl([("verifier analysis", step["verifier_analysis"], "")])}</li>')


def _trajectory_html(row: dict) -> str:
    record = row.get("record") or {}
    score = row.get("score") or {}
    index = row.get("index")
    head = _dl([("trajectory id", record.get("trajectory_id", ""), ""),
                ("question", clip(row.get("query", ""), STEP_TEXT_LIMIT), ""),
                ("gold answer", clip(gold_text(row.get("answer")), STEP_TEXT_LIMIT), ""),
                ("analysis", clip(record.get("analysis", ""), STEP_TEXT_LIMIT), "")])
    steps = "".join(_step_html(s) for s in trajectory_steps(record))
    tail = _dl([("answer", clip(record.get("answer", "") or row.get("prediction", ""), STEP_TEXT_LIMIT), ""),
                ("score", f"{score.get('value')} ({score.get('source', '')}) {score.get('detail', '')}".strip(), ""),
                ("error", clip(row.get("error", ""), STEP_TEXT_LIMIT), "err")])
    status = row.get("status", "")
    return (f'<article class="trajectory" id="traj-{_esc(str(index))}" hidden>'
            f'<h3>item {_esc(str(index))} · {_esc(str(row.get("pid", "")))} · {_esc(status)}</h3>{head}'
            f'<ol class="steps">{steps or "<li class=muted>no planner turns</li>"}</ol>{tail}</article>')


def render_items(rows: list[dict]) -> str:
    """The "Items" section of the HTML report for the result rows of a run ("" when there are none)."""
    if not rows:
        return ""
    ordered = sorted(rows, key=lambda r: (r.get("index") is None, r.get("index") or 0))
    table_rows = item_rows(ordered)
    embedded = min(len(ordered), TRAJECTORY_ITEMS_LIMIT)
    statuses = sorted({r["status"] for r in table_rows})
    head = "".join(f'<th data-sort="{key}" data-type="{kind}"{" aria-sort=ascending" if key == "index" else ""}>'
                   f"{_esc(label)}</th>" for key, label, kind in COLUMNS)
    parts = [
        '<h2>Items</h2><div class="filters">',
        '<input id="item-filter" type="search" placeholder="filter: question, answer, tool, error …" '
        'aria-label="filter items">',
        '<select id="item-status" aria-label="status"><option value="">any status</option>'
        + "".join(f'<option value="{_esc(s)}">{_esc(s)}</option>' for s in statuses) + "</select>",
        '<select id="item-correct" aria-label="correct"><option value="">correct or not</option>'
        '<option value="true">correct</option><option value="false">wrong</option></select>',
        f'<span id="item-count" class="muted">{len(table_rows)} of {len(table_rows)} items</span></div>',
        f'<p class="muted">Click a header to sort, "steps" to see the trajectory. Texts longer than '
        f"{TABLE_TEXT_LIMIT:,} characters in the table and {STEP_TEXT_LIMIT:,} in a trajectory are cut (the note "
        f"says by how much); the full record is in <code>results.jsonl</code> "
        f"(<code>agentflow trace show ID --results results.jsonl</code>).",
    ]
    if embedded < len(ordered):
        parts.append(f" Only the first {embedded:,} of {len(ordered):,} trajectories are embedded.")
    parts.append("</p>")
    parts.append(f'<div class="items-wrap"><table id="items"><thead><tr>{head}<th>trajectory</th></tr></thead>'
                 "<tbody>")
    parts += [_table_row(row, n < embedded) for n, row in enumerate(table_rows)]
    parts.append("</tbody></table></div>")
    parts.append('<aside id="trajectory-panel" hidden><button id="panel-close" type="button" '
                 'aria-label="close">close ✕</button>')
    parts += [_trajectory_html(row) for row in ordered[:embedded]]
    parts.append("</aside>")
    return "\n".join(parts)
