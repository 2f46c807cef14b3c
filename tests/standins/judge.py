"""Scripted judges for the judge service's tests: ``ScriptedEngine`` responders that read the guarded prompt.

* ``always(verdict)``: says CORRECT (or INCORRECT) to everything, like the 135M default said CORRECT to 16 of 16
  wrong answers: the calibration gate must refuse it.
* ``labelled(items)``: right by construction. It finds the prompt's question and proposed answer among the labelled
  items and gives their label; for a prompt it does not know, CORRECT when the proposed answer appears in the
  accepted answers or the tool results shown. The gate must accept it.
* ``ChatStandin(responder)``: either one behind an OpenAI-compatible endpoint (``/v1/models``,
  ``/v1/chat/completions``), for `agentflow serve judge --endpoint`; a context manager on 127.0.0.1, port 0.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agentflow.llm.base import Message
from agentflow.rewards.calibration import Item
from agentflow.rewards.guard import escape
from agentflow.rewards.judge import MAX_PREDICTION_CHARS

Responder = Callable[[Sequence[Message]], str]


def reply(correct: bool, why: str = "scripted") -> str:
    return f"Analysis: {why}\nVerdict: {'CORRECT' if correct else 'INCORRECT'}"


def always(correct: bool = True) -> Responder:
    return lambda _messages: reply(correct, "says the same to every answer")


def _tag(prompt: str, name: str) -> str:
    found = re.search(rf"<{name}>\n(.*?)\n</{name}>", prompt, re.S)
    return found.group(1) if found else ""


def labelled(items: Iterable[Item]) -> Responder:
    labels = {(escape(i.question.strip()), escape(i.answer.strip()[:MAX_PREDICTION_CHARS])): i.label for i in items}

    def respond(messages: Sequence[Message]) -> str:
        prompt = str(messages[-1]["content"])
        question, answer = _tag(prompt, "question"), _tag(prompt, "proposed_answer")
        if (question, answer) in labels:
            return reply(labels[(question, answer)], "the label of this labelled item")
        shown = " ".join(re.findall(r"<(?:accepted_answer|tool_result)>\n(.*?)\n</", prompt, re.S))
        return reply(bool(answer) and answer.lower() in shown.lower(), "the answer is in what was shown")

    return respond


class ChatStandin:
    """An OpenAI-compatible chat endpoint answering with ``responder(messages)``; ``url`` is its base (with /v1),
    ``calls`` counts the completions it served."""

    def __init__(self, responder: Responder, model: str = "scripted-judge"):
        self.responder, self.model, self.calls = responder, model, 0
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": standin.model, "object": "model"}]})
                self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                standin.calls += 1
                text = standin.responder(request.get("messages") or [])
                self._send(200, {"id": f"chat-{standin.calls}", "object": "chat.completion", "model": standin.model,
                                 "choices": [{"index": 0, "finish_reason": "stop",
                                              "message": {"role": "assistant", "content": text}}]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatStandin:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
