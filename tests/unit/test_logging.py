"""JSON log lines (time, level, logger, message, trace and span ids, exception) and the secret redactor."""

import io
import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from agentflow.telemetry import logs

SECRETS_ENV = {"AGENTFLOW_API_KEY": "sk-live-123456", "AGENTFLOW_KAFKA_SASL_PASSWORD": "hunter2-kafka",
               "AGENTFLOW_GATEWAY_API_KEYS": "gw-key-one,gw-key-two", "AGENTFLOW_PLANNER_API_KEY": "planner-key-77"}


def _record(message, *args, exc_info=None, name="agentflow.test", level=logging.WARNING):
    return logging.LogRecord(name, level, __file__, 1, message, args, exc_info)


def _json_line(record) -> dict:
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line
    return json.loads(line)


def test_a_json_line_has_time_level_logger_and_message():
    entry = _json_line(_record("served %d calls", 3))
    assert entry["level"] == "WARNING" and entry["logger"] == "agentflow.test" and entry["message"] == "served 3 calls"
    assert entry["time"].endswith("Z") and "T" in entry["time"]
    assert "trace_id" not in entry and "span_id" not in entry and "exception" not in entry


def test_inside_a_span_the_line_names_its_trace_and_span():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("outer") as span:
        entry = _json_line(_record("inside"))
    context = span.get_span_context()
    assert entry["trace_id"] == format(context.trace_id, "032x") and len(entry["trace_id"]) == 32
    assert entry["span_id"] == format(context.span_id, "016x") and len(entry["span_id"]) == 16
    assert "trace_id" not in _json_line(_record("after"))


def test_an_exception_is_in_the_line():
    try:
        raise ValueError("bad value")
    except ValueError:
        import sys

        entry = _json_line(_record("failed", exc_info=sys.exc_info()))
    assert "Traceback" in entry["exception"] and "ValueError: bad value" in entry["exception"]


@pytest.mark.parametrize("text,expected", [
    ("headers {'Authorization': 'Bearer abc.def-ghi'}", "headers {'Authorization': 'Bearer [REDACTED]'}"),
    ("Authorization: Basic dXNlcjpwYXNz", "Authorization: Basic [REDACTED]"),
    ("metadata [('x-api-key', 'k-999'), ('x-trajectory-id', 't1')]",
     "metadata [('x-api-key', '[REDACTED]'), ('x-trajectory-id', 't1')]"),
    ("sent x-api-key=k-999 to the gateway", "sent x-api-key=[REDACTED] to the gateway"),
    ("upstream said: bearer tok_42 is invalid", "upstream said: bearer [REDACTED] is invalid"),
    ("missing authorization, retrying", "missing authorization, retrying"),  # prose is left alone
    ("Authorization: Bearer [REDACTED] again", "Authorization: Bearer [REDACTED] again"),  # already redacted
])
def test_header_credentials_and_bearer_tokens_are_redacted(text, expected):
    assert logs.redact(text, secrets=[]) == expected


def test_configured_secrets_come_from_the_environment():
    found = logs.configured_secrets({**SECRETS_ENV, "AGENTFLOW_MODEL": "not-a-secret", "HOME": "/root"})
    assert set(found) == {"sk-live-123456", "hunter2-kafka", "gw-key-one", "gw-key-two", "planner-key-77"}


def _log_through_configured_handler(monkeypatch, fmt, emit):
    """Configure logging as a process does (a bare root logger), run ``emit``, return what the handler wrote."""
    for name, value in SECRETS_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(logs.LOG_FORMAT_ENV, fmt)
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []
    out = io.StringIO()
    try:
        logs.configure_logging(verbose=True, stream=out)
        emit(logging.getLogger("agentflow.probe"))
    finally:
        root.handlers, root.level = saved_handlers, saved_level
    return out.getvalue()


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_no_configured_secret_reaches_the_output(monkeypatch, fmt):
    def emit(log):
        log.info("connecting with password %s and key %s", "hunter2-kafka", "sk-live-123456")
        log.warning("gateway keys gw-key-one / gw-key-two, planner planner-key-77")
        try:
            raise RuntimeError("server echoed Authorization: Bearer sk-live-123456")
        except RuntimeError:
            log.exception("call failed")

    written = _log_through_configured_handler(monkeypatch, fmt, emit)
    for secret in ("sk-live-123456", "hunter2-kafka", "gw-key-one", "gw-key-two", "planner-key-77"):
        assert secret not in written
    assert written.count(logs.REDACTED) >= 6 and "RuntimeError" in written
    if fmt == "json":
        entries = [json.loads(line) for line in written.splitlines()]
        assert [e["level"] for e in entries] == ["INFO", "WARNING", "ERROR"]
        assert "RuntimeError" in entries[2]["exception"] and logs.REDACTED in entries[2]["exception"]


def test_text_is_the_default_and_verbose_sets_info(monkeypatch):
    written = _log_through_configured_handler(monkeypatch, "", lambda log: (log.info("hello"), log.debug("hidden")))
    assert written.rstrip().endswith("INFO agentflow.probe: hello") and "hidden" not in written


def test_an_unknown_format_falls_back_to_text_with_a_warning(monkeypatch):
    written = _log_through_configured_handler(monkeypatch, "xml", lambda log: log.info("hello"))
    assert "AGENTFLOW_LOG_FORMAT='xml' is not one of text, json" in written and "INFO agentflow.probe: hello" in written


def test_a_record_with_bad_arguments_still_reaches_the_handler():
    record = _record("%d calls", "not a number")
    assert logs.SecretRedactor().filter(record) is True and record.args == ("not a number",)


# --- a real process: `agentflow run -v` against an LLM server whose error pages echo the credentials ------------

API_KEY, SASL_PASSWORD = "sk-run-0f9e8d7c6b5a", "kafka-pw-51423"
REPLY_BY_PROMPT = {"Analyse the question": "Add the numbers.", "Choose the next step": "Tool Name: python",
                   "Write the input": "```python\nprint(2 + 2)\n```", "Is this enough": "Conclusion: STOP",
                   "Answer the question": "Answer: 4"}


class EchoingProxy:
    """Answers the first ``failures`` chat calls 503 with a body that repeats the caller's credentials (as a
    misconfigured proxy's error page does), then OpenAI-style completions."""

    def __init__(self, failures: int = 2):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        proxy = self
        self.failures = failures

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if proxy.failures > 0:
                    proxy.failures -= 1
                    echo = (f"upstream refused Authorization: {self.headers.get('authorization')} "
                            f"(key {API_KEY}, broker password {SASL_PASSWORD})")
                    return self._send(503, {"error": {"message": echo}})
                prompt = body["messages"][-1]["content"]
                reply = next((r for marker, r in REPLY_BY_PROMPT.items() if marker in prompt), "Answer: 4")
                self._send(200, {"id": "c1", "model": body["model"], "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                                 "choices": [{"message": {"content": reply}, "finish_reason": "stop"}]})

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_run_logs_its_retries_without_the_secrets_the_server_echoed(tmp_path, fmt):
    import os
    import subprocess
    import sys

    proxy = EchoingProxy()
    env = {**os.environ, "AGENTFLOW_LOG_FORMAT": fmt, "AGENTFLOW_API_KEY": API_KEY,
           "AGENTFLOW_KAFKA_SASL_PASSWORD": SASL_PASSWORD}
    try:
        result = subprocess.run([sys.executable, "-m", "agentflow.cli", "-v", "run", "What is 2 + 2?", "--engine",
                                 "openai", "--endpoint", proxy.url, "--model", "m", "--tools", "python",
                                 "--max-steps", "1"], env=env, capture_output=True, text=True, timeout=120)
    finally:
        proxy.httpd.shutdown()
    assert proxy.failures == 0, result.stderr  # both failures were served, so both were logged
    assert API_KEY not in result.stderr and SASL_PASSWORD not in result.stderr
    retries = [line for line in result.stderr.splitlines() if "retry" in line and "HTTP 503" in line]
    assert len(retries) == 2, result.stderr
    assert all("Authorization: Bearer [REDACTED] (key [REDACTED], broker password [REDACTED])" in line
               for line in retries)
    if fmt == "json":
        entries = [json.loads(line) for line in retries]
        assert {e["level"] for e in entries} == {"WARNING"}
        assert {e["logger"] for e in entries} == {"agentflow.llm.openai_engine"}
