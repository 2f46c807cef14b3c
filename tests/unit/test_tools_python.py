"""Pure parts of the python tool; the sandbox itself is tested in tests/integration/test_sandbox.py."""

import pytest

from agentflow.errors import InvalidInput
from agentflow.tools.python_tool import (
    PythonTool,
    PythonToolConfig,
    read_isolation,
    truncate_output,
    unwrap_code,
)


@pytest.mark.parametrize("command, code", [
    ("print(1)", "print(1)"),
    ("```python\nprint(1)\n```", "print(1)\n"),
    ("```py\nx = 2\n```", "x = 2\n"),
    ("```\nprint(3)\n```", "print(3)\n"),
    ("Run this:\n```Python\nprint(4)\n```\nthanks", "print(4)\n"),
    ("```python\nfirst()\n```\n```python\nsecond()\n```", "first()\n"),
])
def test_unwrap_code(command, code):
    assert unwrap_code(command) == code


def test_truncate_output_keeps_short_text():
    assert truncate_output("abc", 10) == "abc"


def test_truncate_output_cuts_with_a_marker():
    text = truncate_output("x" * 500, 100)
    assert len(text) <= 100
    assert text.startswith("x")
    assert "[output truncated: 400 of 500 characters omitted]" in text


def test_truncate_output_says_when_the_child_dropped_output():
    text = truncate_output("x" * 500, 100, dropped=True)
    assert len(text) <= 100
    assert "[output truncated: 400 of over 500 characters omitted]" in text


def test_config_rejects_non_positive_limits():
    with pytest.raises(InvalidInput, match="memory_mb"):
        PythonToolConfig(memory_mb=0)


def test_config_rejects_a_missing_temp_root(tmp_path):
    with pytest.raises(InvalidInput, match="temp_root"):
        PythonToolConfig(temp_root=str(tmp_path / "missing"))


def test_config_fields_have_help_texts():
    from dataclasses import fields

    assert all(f.metadata.get("help") for f in fields(PythonToolConfig))


def test_spec_mentions_the_limits():
    spec = PythonTool(PythonToolConfig(timeout_s=5, memory_mb=256)).spec
    assert spec.name == "python"
    assert "5 s wall time" in spec.limitations and "256 MiB" in spec.limitations


def test_empty_program_is_an_error_result():
    result = PythonTool().run("```python\n\n```", timeout=5)
    assert result.error.startswith("invalid_input:")


def test_no_time_left_is_a_timeout_result():
    assert PythonTool().run("print(1)", timeout=0).error.startswith("timeout:")


@pytest.mark.parametrize("report, layers", [
    (b'{"isolation": ["net_ns", "seccomp"]}\n', ["net_ns", "seccomp"]),
    (b'{"isolation": ["net_ns"]}\n{"isolation": ["forged"]}\n', ["net_ns"]),  # only the first line counts
    (b"", []),
    (b"garbage\xff\xfe\n", []),
    (b'{"isolation": 7}', []),
    (b'{"isolation": ["ok", 7]}', []),
    (b"[1, 2]", []),
])
def test_read_isolation_takes_only_a_well_formed_first_line(report, layers):
    assert read_isolation(report) == layers


def test_config_rejects_root_as_the_sandbox_uid():
    with pytest.raises(InvalidInput, match="sandbox_uid"):
        PythonToolConfig(sandbox_uid=0)
