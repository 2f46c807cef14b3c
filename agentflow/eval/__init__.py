"""The evaluation harness: run the agent over a benchmark file, score every answer with ``agentflow.rewards``, and
write per-item results (JSONL), a summary (JSON) and Markdown/HTML reports; compare two runs with a paired test.

``agentflow eval`` (agentflow/eval/cli.py) is the command-line front; docs/evaluation.md describes the outputs.
"""

from agentflow.eval.compare import compare_runs, mcnemar_exact
from agentflow.eval.data import Item, load_items
from agentflow.eval.report import write_reports
from agentflow.eval.runner import evaluate_item, run_items
from agentflow.eval.summary import summarize

__all__ = ["Item", "compare_runs", "evaluate_item", "load_items", "mcnemar_exact", "run_items", "summarize",
           "write_reports"]
