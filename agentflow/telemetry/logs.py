"""Process logging: text or JSON lines (``AGENTFLOW_LOG_FORMAT``), with secrets redacted in both.

JSON lines carry ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, the current span's ``trace_id`` and
``span_id`` (hex, as trajectory records write them) when there is one, and ``exception`` when the record has one.

``SecretRedactor`` replaces with ``[REDACTED]``: the values of ``Authorization`` and ``x-api-key`` headers, the
token after ``Bearer``, and every configured secret (the environment's API keys, tokens and passwords, see
``configured_secrets``, plus any ``register_secret`` was given) wherever it appears.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from datetime import datetime, timezone

from opentelemetry import trace

LOG_FORMAT_ENV = "AGENTFLOW_LOG_FORMAT"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REDACTED = "[REDACTED]"

# The project's secret settings (agentflow/config.py, agentflow/bus/config.py, agentflow/rpc/server.py,
# agentflow/llm/server.py, the gateway's api_keys) and any other AGENTFLOW_* variable named like one.
SECRET_VARIABLES = ("AGENTFLOW_GATEWAY_API_KEYS", "AGENTFLOW_API_KEY", "AGENTFLOW_LLM_API_TOKEN",
                    "AGENTFLOW_LLM_ADMIN_TOKEN", "AGENTFLOW_RPC_SERVICE_TOKEN", "AGENTFLOW_KAFKA_SASL_PASSWORD",
                    "AGENTFLOW_ROLLOUT_ADMIN_TOKEN")
_SECRET_NAME = re.compile(r"^AGENTFLOW_\w*(API_KEYS?|TOKEN|PASSWORD|SECRET)$")
# "Authorization: Bearer x", "'x-api-key': 'x'", "('authorization', 'Basic x')", "x-api-key=x": keep the name and
# the scheme, replace the credential
_HEADER = re.compile(r"(?i)\b(authorization|x-api-key)(['\"]?\s*[:=]\s*['\"]?|['\"]\s*,\s*['\"])"
                     r"((?:bearer|basic|token)\s+)?(?!(?:bearer|basic|token)\b)[^\s'\",;)}\[\]]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]+")

_registered: set[str] = set()


def register_secret(value: str) -> None:
    """Redact ``value`` from every log record from now on (a secret that is not in the environment)."""
    if value:
        _registered.add(value)


def configured_secrets(environ=None) -> list[str]:
    """The secret values the environment configures, longest first (so a secret inside another goes too)."""
    environ = os.environ if environ is None else environ
    values = set(_registered)
    for name, value in environ.items():
        if name in SECRET_VARIABLES or _SECRET_NAME.match(name):
            values.update(part.strip() for part in value.split(",") if part.strip())
    return sorted(values, key=len, reverse=True)


def redact(text: str, secrets=None) -> str:
    """``text`` with header credentials, bearer tokens and configured secrets replaced by ``[REDACTED]``."""
    text = _HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] or ''}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m[1]}{REDACTED}", text)
    for secret in configured_secrets() if secrets is None else secrets:
        text = text.replace(secret, REDACTED)
    return text


class SecretRedactor(logging.Filter):
    """Rewrites each record's message, exception and stack text with secrets redacted (it never drops one).

    Secrets are read from the environment at every record, so ones set after start-up are covered too."""

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = configured_secrets()
        try:
            message = record.getMessage()
        except Exception:  # bad %-arguments: leave the record for the handler to report
            return True
        record.msg, record.args = redact(message, secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, secrets)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the current span's trace and span ids."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": _iso_utc(record.created), "level": record.levelname, "logger": record.name,
                 "message": record.getMessage()}
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = format(context.trace_id, "032x")
            entry["span_id"] = format(context.span_id, "016x")
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def _iso_utc(created: float) -> str:
    return datetime.fromtimestamp(created, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log_format(environ=None) -> str:
    """``AGENTFLOW_LOG_FORMAT`` (``text`` when unset or unknown)."""
    value = (os.environ if environ is None else environ).get(LOG_FORMAT_ENV, "").strip().lower()
    return value if value in LOG_FORMATS else "text"


def configure_logging(verbose: bool = False, *, stream=None) -> None:
    """Log to stderr (INFO with ``verbose``, else WARNING) in ``AGENTFLOW_LOG_FORMAT``, secrets redacted.

    Like ``logging.basicConfig``, it leaves a root logger that already has someone else's handlers alone (a test
    runner's), but still redacts what those handlers write. Calling it again replaces its own handler."""
    root = logging.getLogger()
    foreign = [h for h in root.handlers if not getattr(h, "_agentflow", False)]
    if foreign:
        for handler in foreign:
            if not any(isinstance(f, SecretRedactor) for f in handler.filters):
                handler.addFilter(SecretRedactor())
        return
    for handler in list(root.handlers):
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler._agentflow = True
    handler.setFormatter(JsonFormatter() if log_format() == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(SecretRedactor())
    root.addHandler(handler)
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    requested = os.environ.get(LOG_FORMAT_ENV, "").strip().lower()
    if requested and requested not in LOG_FORMATS:
        logging.getLogger(__name__).warning("%s=%r is not one of %s; logging text", LOG_FORMAT_ENV, requested,
                                            ", ".join(LOG_FORMATS))
