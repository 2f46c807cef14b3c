from agentflow.errors import EngineError, EngineTimeout
from agentflow.llm.base import Completion
from agentflow.tools.generalist import GeneralistConfig, GeneralistTool


class FakeEngine:
    """Answers from a script, or raises what it was given."""

    supports_structured_output = False

    def __init__(self, answer="Paris.", error=None):
        self.answer, self.error, self.calls = answer, error, []

    def complete(self, messages, sampling, *, timeout, json_schema=None, key=""):
        self.calls.append({"messages": messages, "sampling": sampling, "timeout": timeout})
        if self.error:
            raise self.error
        return Completion(text=self.answer, model_version="fake-1", finish_reason="stop")


def test_answers_with_the_engine():
    engine = FakeEngine("  Paris.  ")
    result = GeneralistTool(engine).run("What is the capital of France?", timeout=5)
    assert result.ok and result.output == "Paris."
    assert result.meta["model_version"] == "fake-1"
    call = engine.calls[0]
    assert call["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert call["timeout"] == 5


def test_timeout_is_the_smaller_of_config_and_call():
    engine = FakeEngine()
    GeneralistTool(engine, GeneralistConfig(timeout_s=2, max_tokens=64)).run("q?", timeout=30)
    assert engine.calls[0]["timeout"] == 2
    assert engine.calls[0]["sampling"].max_tokens == 64


def test_engine_timeout_becomes_a_timeout_error():
    result = GeneralistTool(FakeEngine(error=EngineTimeout("slow"))).run("q?", timeout=5)
    assert result.error.startswith("timeout:")


def test_engine_error_becomes_unavailable():
    result = GeneralistTool(FakeEngine(error=EngineError("connection refused"))).run("q?", timeout=5)
    assert result.error.startswith("unavailable:") and "connection refused" in result.error


def test_empty_question_and_empty_answer_are_errors():
    assert GeneralistTool(FakeEngine()).run("  ", timeout=5).error.startswith("invalid_input:")
    assert GeneralistTool(FakeEngine("   ")).run("q?", timeout=5).error.startswith("bad_response:")
