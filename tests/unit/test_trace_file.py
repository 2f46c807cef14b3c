"""Spans to an OTLP/JSON file (AGENTFLOW_TRACES_DIR), what `agentflow demo` keeps when no collector is configured."""

import json
import os
import subprocess
import sys

CHILD = """
from opentelemetry import trace
from agentflow import telemetry
telemetry.setup_tracing("probe")
with trace.get_tracer("t").start_as_current_span("outer") as outer:
    with trace.get_tracer("t").start_as_current_span("inner"):
        pass
print(format(outer.get_span_context().trace_id, "032x"))
telemetry.shutdown_tracing()
"""


def test_spans_are_written_as_otlp_json_lines(tmp_path):
    env = {**os.environ, "AGENTFLOW_TRACES_DIR": str(tmp_path)}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    trace_id = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                              check=True).stdout.strip()
    lines = (tmp_path / "traces-probe.jsonl").read_text().splitlines()
    spans = [span for line in lines for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for span in ss["spans"]]
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) == {"outer", "inner"}
    assert by_name["outer"]["traceId"] == by_name["inner"]["traceId"] == trace_id  # hex, as OTLP/JSON wants
    assert by_name["inner"]["parentSpanId"] == by_name["outer"]["spanId"] and len(by_name["outer"]["spanId"]) == 16
