"""An engine over any OpenAI-compatible chat-completions server (vLLM, KServe's huggingface runtime, serve-llm).

It asks for ``logprobs`` and vLLM's ``return_token_ids`` and records what the server gives back: prompt and
response token ids, per-token logprobs, and the version that served the call (the ``x-model-version`` header when
present, else the response's ``model``).

Each call is a GenAI ``chat {model}`` client span with one HTTP client span per attempt under it; the attempt's
request carries that span's W3C trace context (``traceparent``), so a traced server (vLLM) continues the trace.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import httpx
from opentelemetry import propagate

from agentflow import telemetry
from agentflow.errors import EngineError, EngineTimeout, Reason
from agentflow.llm.base import PRIORITY, Completion, Message, Sampling

RETRYABLE_STATUS = {429, 502, 503, 504}
PROVIDER = "openai"  # gen_ai.provider.name: the API spoken (vLLM, KServe and serve-llm speak OpenAI's)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenAIEngineConfig:
    endpoint: str  # base URL including /v1, e.g. http://127.0.0.1:8000/v1
    model: str = ""  # model name sent to the server; empty: the first one /models lists
    api_key: str = ""
    timeout_s: float = 60.0  # per call, further capped by the caller's deadline
    retries: int = 2  # extra attempts on connection errors and 429/5xx
    backoff_s: float = 0.25  # first retry delay, doubled each time
    structured_output: bool = True  # send response_format json_schema when the caller gives a schema
    token_details: bool = True  # ask for logprobs and return_token_ids
    # the servers schedule by priority (vLLM --scheduling-policy priority): send each call's ``base.PRIORITY``
    # (vLLM refuses a priority other than 0 otherwise)
    priority_scheduling: bool = False


class OpenAIEngine:
    def __init__(self, config: OpenAIEngineConfig, *, transport: httpx.BaseTransport | None = None):
        if not config.endpoint.startswith(("http://", "https://")):
            raise EngineError(f"engine endpoint must be an http(s) URL, got {config.endpoint!r}",
                              reason=Reason.INVALID_INPUT)
        self.config = config
        self.supports_structured_output = config.structured_output
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self._http = httpx.Client(base_url=config.endpoint.rstrip("/") + "/", headers=headers, transport=transport)
        self._model = config.model

    def complete(self, messages: Sequence[Message], sampling: Sampling, *, timeout: float,
                 json_schema: dict | None = None, key: str = "") -> Completion:
        started = time.monotonic()
        deadline = started + min(timeout, self.config.timeout_s)
        body = self._request_body(messages, sampling, json_schema)
        headers = {"x-trajectory-id": key} if key else {}
        if sampling.model_version:
            headers["x-model-version-pin"] = sampling.model_version
        with telemetry.chat_span(PROVIDER, self._model, sampling, server_url=self.config.endpoint) as span:
            model = self.model_name(deadline)
            if not self.config.model:
                telemetry.name_chat_span(span, model)
            response = self._request("POST", "chat/completions", {"model": model, **body}, headers, deadline)
            data = _json(response)
            completion = parse_chat_response(data, response.headers.get("x-model-version", ""))
            _record_response(span, data, completion)
        completion.latency_s = time.monotonic() - started
        return completion

    def model_name(self, deadline: float) -> str:
        if not self._model:
            listed = _json(self._request("GET", "models", None, {}, deadline)).get("data") or []
            if not listed:
                raise EngineError(f"{self.config.endpoint} serves no models")
            self._model = listed[0]["id"]
        return self._model

    def _request_body(self, messages, sampling: Sampling, json_schema: dict | None) -> dict:
        body = {
            "messages": list(messages),
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "n": 1,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if self.config.priority_scheduling and PRIORITY.get():
            body["priority"] = PRIORITY.get()
        if self.config.token_details:
            body.update(logprobs=True, top_logprobs=0, return_token_ids=True)
        if json_schema is not None and self.config.structured_output:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": json_schema, "strict": True}}
        return body

    def _request(self, method: str, path: str, body, headers: dict, deadline: float) -> httpx.Response:
        """One call, retried with exponential backoff on connection errors and 429/5xx while time remains."""
        delay = self.config.backoff_s
        for attempt in range(self.config.retries + 1):
            try:
                return self._send(method, path, body, headers, deadline, attempt)
            except _Retryable as e:
                if attempt == self.config.retries or time.monotonic() + delay >= deadline:
                    raise EngineError(f"{self.config.endpoint}: {e}") from e
                log.warning("%s %s failed (%s); retry %d of %d in %.2f s", method, path, e, attempt + 1,
                            self.config.retries, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, body, headers: dict, deadline: float, attempt: int = 0) -> httpx.Response:
        left = deadline - time.monotonic()
        if left <= 0:
            raise EngineTimeout(f"no time left for a call to {self.config.endpoint}")
        url = str(self._http.base_url.join(path))
        with telemetry.http_client_span(method, url, resend_count=attempt) as span:
            headers = dict(headers)
            propagate.inject(headers)  # traceparent of this attempt's span
            try:
                response = self._http.request(method, path, json=body, headers=headers, timeout=left)
            except httpx.TimeoutException as e:
                raise EngineTimeout(f"{self.config.endpoint} did not answer within {left:.1f} s") from e
            except httpx.TransportError as e:
                raise _Retryable(f"cannot reach the server ({type(e).__name__}: {e})") from e
            telemetry.record_http_status(span, response.status_code)
        if response.status_code in RETRYABLE_STATUS:
            raise _Retryable(f"HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code >= 400:
            raise EngineError(f"{self.config.endpoint} answered HTTP {response.status_code}: {response.text[:300]}")
        return response

    def close(self) -> None:
        self._http.close()


class _Retryable(Exception):
    pass


def _record_response(span, data: dict, completion: Completion) -> None:
    """The chat span's response attributes: the server's own usage counts where it reports them."""
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    choices = data.get("choices") if isinstance(data.get("choices"), list) else []
    telemetry.record_chat_response(
        span, response_model=str(data.get("model") or ""), response_id=str(data.get("id") or ""),
        finish_reasons=[str(c.get("finish_reason") or "") for c in choices if isinstance(c, dict)],
        input_tokens=usage.get("prompt_tokens", len(completion.prompt_token_ids)),
        output_tokens=usage.get("completion_tokens", len(completion.token_ids)),
        model_version=completion.model_version)


def _json(response: httpx.Response) -> dict:
    try:
        data = response.json()
    except ValueError:
        raise EngineError(f"server answered non-JSON: {response.text[:200]!r}") from None
    if not isinstance(data, dict):
        raise EngineError(f"server answered unexpected JSON: {str(data)[:200]}")
    return data


def parse_chat_response(data: dict, served_version: str = "") -> Completion:
    """Read an OpenAI chat response, with vLLM's token ids where present."""
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
    except (KeyError, IndexError, TypeError, AttributeError) as e:
        raise EngineError(f"malformed chat response: {str(data)[:300]}") from e
    logprob_items = ((choice.get("logprobs") or {}).get("content")) or []
    return Completion(
        text=text,
        prompt_token_ids=list(data.get("prompt_token_ids") or choice.get("prompt_token_ids") or []),
        token_ids=list(choice.get("token_ids") or []),
        logprobs=[float(item["logprob"]) for item in logprob_items],
        model_version=served_version or data.get("model", ""),
        finish_reason=choice.get("finish_reason") or "",
    )
