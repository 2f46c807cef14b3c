"""The OpenAI chat protocol of the LLM server (``agentflow.llm.server``), without HTTP: a request's fields checked
before the engine sees it (``parse_chat``: ``RequestError`` names the first bad field, with its HTTP status) and the
OpenAI-style response built from the engine's completion (``chat_completion``), with vLLM's ``return_token_ids`` and
raw per-token ``logprobs``."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from agentflow.config import setting
from agentflow.errors import InvalidInput
from agentflow.llm.base import Completion, Engine, Sampling

ROLES = ("system", "user", "assistant", "tool")
MAX_STOPS = 16  # OpenAI allows 4; the project's modules may send more
MAX_SEED = 2 ** 63 - 1  # torch.Generator.manual_seed takes 64-bit seeds


@dataclass(frozen=True)
class ServerSettings:
    """Limits and credentials of `agentflow serve-llm`: ``AGENTFLOW_LLM_<FIELD>`` or the matching flag."""

    max_tokens: int = setting(2048, "largest max_tokens a request may ask for (a larger one is refused: 400)")
    default_max_tokens: int = setting(256, "max_tokens of a request that names none")
    max_prompt_tokens: int = setting(8192, "longest prompt in tokens, after the chat template (longer: 400)")
    max_messages: int = setting(512, "most messages in one request")
    max_body_bytes: int = setting(4 * 1024 * 1024, "largest request body in bytes (larger: 413)")
    request_timeout_s: float = setting(300.0, "deadline of a chat request, in seconds (past it: 504; a request's "
                                              "own 'timeout' field may only shorten it)")
    api_token: str = setting("", "bearer token the chat routes (/v1/...) require; empty: they are open",
                             repr=False)
    admin_token: str = setting("", "bearer token the admin API requires; empty: the admin API is off",
                               repr=False)
    allowed_model_uris: str = setting("", "comma-separated folders and URI prefixes (s3://bucket/models/) that "
                                          "version URIs may come from, beside --model's folder and the model "
                                          "stores", repr=False)
    model_stores: str = setting("", "comma-separated model store roots (the trainer's --model-store) whose "
                                    "versions may be loaded")

    def __post_init__(self):
        positive = {"max_tokens": self.max_tokens, "default_max_tokens": self.default_max_tokens,
                    "max_prompt_tokens": self.max_prompt_tokens, "max_messages": self.max_messages,
                    "max_body_bytes": self.max_body_bytes, "request_timeout_s": self.request_timeout_s}
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise InvalidInput(f"AGENTFLOW_LLM_{name.upper()} must be positive, got {value}")
        if self.default_max_tokens > self.max_tokens:
            raise InvalidInput(f"default_max_tokens ({self.default_max_tokens}) is over max_tokens "
                               f"({self.max_tokens})")


class RequestError(Exception):
    """A request the server refuses: its HTTP status and, for a bad field, the field's name (OpenAI's ``param``);
    ``kind``: the error body's ``type`` where it is not the one the status implies (vLLM's names on its routes)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.param = param
        self.kind = kind


@dataclass(frozen=True)
class ChatRequest:
    """A checked chat request: what the engine gets, and what the response should carry."""

    messages: list
    sampling: Sampling
    json_schema: dict | None
    timeout_s: float
    logprobs: bool
    return_token_ids: bool


def parse_chat(body: dict, model_name: str, settings: ServerSettings) -> ChatRequest:
    """Check every field the server uses (types, ranges, sizes); ``RequestError`` names the first bad one."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > settings.max_messages:
        raise RequestError(400, f"at most {settings.max_messages} messages, got {len(messages)}", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise RequestError(400, f"messages[{i}] must be {{role, content}} with role one of {', '.join(ROLES)} "
                                    "and content a string", "messages")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError(400, "model must be a string", "model")
    if model and model != model_name:
        raise RequestError(404, f"model {model!r} is not served here; this server serves {model_name!r}", "model")
    if _integer(body, "n", 1, 1, 1) != 1:
        raise RequestError(400, "only n=1 is supported", "n")
    if body.get("stream"):
        raise RequestError(400, "stream is not supported", "stream")
    max_tokens = body.get("max_tokens")
    field = "max_tokens" if max_tokens is not None else "max_completion_tokens"
    max_tokens = _integer(body, field, settings.default_max_tokens, 1, settings.max_tokens)
    sampling = Sampling(temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True), max_tokens=max_tokens,
                        seed=_integer(body, "seed", None, 0, MAX_SEED), stop=_stops(body.get("stop")))
    timeout = _number(body, "timeout", settings.request_timeout_s, 0.0, math.inf, low_open=True)
    return ChatRequest([{"role": m["role"], "content": m["content"]} for m in messages], sampling,
                       _json_schema(body.get("response_format")), min(timeout, settings.request_timeout_s),
                       _flag(body, "logprobs"), _flag(body, "return_token_ids"))


def _number(body: dict, name: str, default, low: float, high: float, *, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < low or (low_open and value == low) or value > high:
        side = "(" if low_open else "["
        raise RequestError(400, f"{name} must be a number in {side}{low:g}, {high:g}], got {value!r}", name)
    return float(value)


def _integer(body: dict, name: str, default, low: int, high: int):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError(400, f"{name} must be an integer from {low} to {high}, got {value!r}", name)
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise RequestError(400, f"{name} must be true or false, got {value!r}", name)
    return bool(value)


def _stops(stop) -> tuple[str, ...]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(
            isinstance(s, str) and 0 < len(s) <= 256 for s in stops):
        raise RequestError(400, f"stop must be a string or a list of at most {MAX_STOPS} non-empty strings of at "
                                "most 256 characters", "stop")
    return tuple(stops)


def _json_schema(response_format) -> dict | None:
    """The schema a ``response_format`` asks for (None for text); flat string/enum schemas are decoded by the
    engine, and every other JSON object schema is accepted and answered as free text (as before)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or response_format.get("type") not in ("text", "json_object",
                                                                                      "json_schema"):
        raise RequestError(400, "response_format must be {type: text | json_object | json_schema}", "response_format")
    if response_format["type"] != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise RequestError(400, "response_format.json_schema.schema must be a JSON object", "response_format")
    properties = schema.get("properties")
    if properties is not None and not isinstance(properties, dict):
        raise RequestError(400, "the schema's properties must be an object", "response_format")
    for name, spec in (properties or {}).items():
        enum = spec.get("enum") if isinstance(spec, dict) else None
        if enum is not None and (not isinstance(enum, list) or not enum or not all(
                isinstance(e, str) for e in enum)):
            raise RequestError(400, f"the schema's {name!r} enum must be a non-empty list of strings",
                               "response_format")
    return schema


def string_field(body: dict, name: str) -> str:
    """``body[name]``, a non-empty string (the admin API's fields)."""
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"{name!r} must be a non-empty string")
    return value


def chat_completion(engine: Engine, model_name: str, body: dict, settings: ServerSettings,
                    *, wait=None) -> tuple[dict, Completion]:
    """The OpenAI-style response to one chat request (``RequestError`` for a bad one), and the engine's completion.
    ``wait(pending, timeout)`` waits on an engine that can ``submit`` (the server's: it cancels the request when the
    client goes away)."""
    request = parse_chat(body, model_name, settings)
    completion = _generate(engine, request, settings, wait)
    return _response(request, completion, model_name), completion


def _generate(engine: Engine, request: ChatRequest, settings: ServerSettings, wait) -> Completion:
    if wait is not None and hasattr(engine, "submit"):
        pending = engine.submit(request.messages, request.sampling, timeout=request.timeout_s,
                                json_schema=request.json_schema, max_prompt_tokens=settings.max_prompt_tokens)
        return wait(pending, request.timeout_s)
    return engine.complete(request.messages, request.sampling, timeout=request.timeout_s,
                           json_schema=request.json_schema)


def _response(request: ChatRequest, completion: Completion, model_name: str) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": completion.text},
              "finish_reason": completion.finish_reason or "stop"}
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "choices": [choice],
                "usage": {"prompt_tokens": len(completion.prompt_token_ids),
                          "completion_tokens": len(completion.token_ids),
                          "total_tokens": len(completion.prompt_token_ids) + len(completion.token_ids)}}
    if request.logprobs:
        choice["logprobs"] = {"content": [{"token": str(t), "logprob": lp}
                                          for t, lp in zip(completion.token_ids, completion.logprobs)]}
    if request.return_token_ids:
        response["prompt_token_ids"] = completion.prompt_token_ids
        choice["token_ids"] = completion.token_ids
    return response
