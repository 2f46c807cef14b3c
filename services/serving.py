"""`agentflow serve NAME` and `agentflow serve-llm`: one process each, configured from flags and AGENTFLOW_* env.

Each prints one JSON line on stdout once it listens (``{"service": ..., "grpc_port": ...}``) so a supervisor (such
as `agentflow up`) can learn the ports it picked, then runs until SIGTERM/SIGINT and drains.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from agentflow import cli_args, telemetry
from agentflow.bus.config import BusConfig
from agentflow.config import EngineSettings, flag_name, from_env, setting
from agentflow.errors import InvalidInput
from agentflow.flow.loop import LoopConfig
from agentflow.rpc.server import RpcConfig
from agentflow.tools import tool_names

SERVICES = ("gateway", "memory", "planner", "executor", "verifier", "generator")
#: Services `agentflow serve` also runs, outside the ring that `agentflow up` starts (docs/judge.md).
OPTIONAL_SERVICES = ("judge",)
MODULE_SERVICES = ("planner", "executor", "verifier", "generator")


def announce_and_wait(stop: Callable[[], None], *, must: Callable[[], None] | None = None, **ready) -> None:
    """Print the ready line (JSON), block until SIGTERM or SIGINT, then call ``stop`` (it drains and returns).
    ``must`` runs meanwhile (e.g. the brokers' first answer, ``reach_brokers``): if it raises, that stops the
    service too, and its error is raised after the drain.

    The handlers go in first: a parent may signal the moment it reads the line, and the default SIGTERM would kill
    the process without a drain. The wait has a timeout because the kernel may deliver the signal to any thread, and
    Python runs the handler only once the main thread is back in Python code.
    """
    from agentflow.services.runtime import on_stop_signal

    requested, failed = threading.Event(), []
    on_stop_signal(requested.set)
    print(json.dumps(ready), flush=True)

    def check() -> None:
        try:
            must()
        except Exception as e:  # noqa: BLE001 - raised again in the main thread
            failed.append(e)
            requested.set()

    if must is not None:
        threading.Thread(target=check, name="first-contact", daemon=True).start()
    while not requested.wait(0.5):
        pass
    stop()
    if failed:
        raise failed[0]


@dataclass(frozen=True)
class AgentSettings:
    """Which engines answer the modules (AGENTFLOW_PROFILE, AGENTFLOW_ENVIRONMENT)."""

    profile: str = setting("llm", "llm (every module LLM-backed) or tiny-deterministic "
                                  "(rule-based frozen modules; docs/training.md)")
    environment: str = setting("", "'synthetic' or 'synthetic:SEED': the search corpus and "
                                   "the generalist's knowledge of the synthetic environment")
    reward_kind: str = setting("math", "the rule (agentflow.rewards) the memory service "
                                       "scores answers with when a query has ground truth")


def build_service(name: str, engine_settings: EngineSettings, planner_settings: EngineSettings, bus: BusConfig,
                  loop: LoopConfig, tools: list[str], agent_settings: AgentSettings = AgentSettings()):
    """The service object and its gRPC service name."""
    import importlib

    module = importlib.import_module(f"agentflow.services.{name}")
    if name == "memory":
        return (module.MemoryService(loop, reward_kind=agent_settings.reward_kind,
                                     settings=from_env(module.MemorySettings, "MEMORY_")), module.GRPC_SERVICE)
    if name == "gateway":
        from agentflow.services.gateway import GatewayConfig

        return module.Gateway(bus, loop, from_env(GatewayConfig, "GATEWAY_")), module.GRPC_SERVICE
    if name == "judge":  # on the modules' engine (--endpoint: any OpenAI-compatible server)
        from agentflow.llm import build_engine

        settings = from_env(module.JudgeSettings, "JUDGE_")
        return module.JudgeService(build_engine(engine_settings), settings), module.GRPC_SERVICE
    from agentflow.envs.profiles import get_profile
    from agentflow.llm import build_engine
    from agentflow.envs.synthetic import environment_from_spec

    profile = get_profile(agent_settings.profile)
    env = environment_from_spec(agent_settings.environment)
    engine = build_engine(engine_settings)
    if name != "planner":  # only the planner service calls the planner's engine: only it follows a routing table
        planner_settings = replace(planner_settings, routing="")
    planner_engine = engine if planner_settings == engine_settings else build_engine(planner_settings, bus)
    agent = profile.build_agent(planner_engine, tools, loop, llm_engine=engine,
                                call_timeout_s=engine_settings.timeout_s,
                                tools_config=env.tools_config() if env else None,
                                knowledge=env.knowledge() if env else ())
    service_class = {"planner": "PlannerService", "executor": "ExecutorService", "verifier": "VerifierService",
                     "generator": "GeneratorService"}[name]
    return getattr(module, service_class)(agent), module.GRPC_SERVICE


def _check_gateway_auth(config, rpc: RpcConfig) -> None:
    """Users authenticate at the gateway: one reachable from other machines needs API keys, or an explicit opt-out."""
    from agentflow.rpc.server import is_loopback

    if not (config.api_keys or config.allow_anonymous or is_loopback(rpc.host)):
        raise InvalidInput(f"the gateway listens on {rpc.host} but has no API keys: set AGENTFLOW_GATEWAY_API_KEYS, "
                           "or AGENTFLOW_GATEWAY_ALLOW_ANONYMOUS=true to accept anyone")


#: `serve` flags only the retriever reads, and flags only the ring services read
_RETRIEVER_FLAGS = ("index", "api_token")
_RING_FLAGS = ("bootstrap", "endpoint", "planner_endpoint", "tools", "metrics_port", "profile", "environment")


def _check_flags_apply(args) -> None:
    """A flag the named service would ignore is a mistake: say so before anything starts."""
    ignored = _RING_FLAGS if args.name == "retriever" else _RETRIEVER_FLAGS
    given = [flag_name(name) for name in ignored if getattr(args, name, None) is not None]
    if given:
        raise InvalidInput(f"{', '.join(given)}: not read by `agentflow serve {args.name}`")


def serve(args) -> int:
    from agentflow.bus.clients import reach_brokers
    from agentflow.services.runtime import ServiceRunner
    from agentflow.tools.registry import DEFAULT_TOOLS

    name = args.name
    _check_flags_apply(args)
    if name == "retriever":  # an HTTP server beside the ring, not a ring service (docs/retrieval.md)
        from agentflow.retrieval.cli import serve_retriever

        return serve_retriever(args)
    telemetry.setup_tracing(f"agentflow-{name}")
    telemetry.instrument_grpc_clients()
    bus = BusConfig.from_env()
    if args.bootstrap:
        bus = replace(bus, bootstrap_servers=args.bootstrap)
    rpc = from_env(RpcConfig, "RPC_", flags={"port": args.port, "host": args.host or None})
    engine = from_env(EngineSettings)
    if args.endpoint:
        engine = replace(engine, engine="openai", endpoint=args.endpoint)
    planner = from_env(EngineSettings, "PLANNER_", engine)
    if args.planner_endpoint:
        planner = replace(planner, engine="openai", endpoint=args.planner_endpoint)
    tools = [t for t in (args.tools or ",".join(DEFAULT_TOOLS)).split(",") if t]
    agent_settings = from_env(AgentSettings, flags={"profile": args.profile or None,
                                                    "environment": args.environment or None})
    service, grpc_name = build_service(name, engine, planner, bus, from_env(LoopConfig, "LOOP_"), tools,
                                       agent_settings)
    if name == "gateway":
        _check_gateway_auth(service.config, rpc)
        # every waiting call holds a thread: room for all of them, and for health checks
        rpc = replace(rpc, max_workers=max(rpc.max_workers, service.config.max_in_flight + 8),
                      max_request_kb=rpc.max_request_kb or service.config.max_request_kb)
    runner = ServiceRunner(service, grpc_name, rpc, bus, concurrency=args.concurrency).start()
    metrics_port = telemetry.serve_metrics(args.metrics_port, rpc.host) if args.metrics_port is not None else None
    # health says NOT_SERVING until the brokers answer; if they never do, the service ends (exit 2)
    announce_and_wait(runner.stop, must=lambda: reach_brokers(bus), service=name, grpc_port=runner.port,
                      metrics_port=metrics_port)
    return 0


def serve_llm(args) -> int:
    from agentflow.llm.models import smollm2_dir
    from agentflow.llm.protocol import ServerSettings
    from agentflow.llm.server import make_server, serve_in_background
    from agentflow.llm.versions import Versions

    flags = {name: getattr(args, name, None) for name in _LLM_FLAGS}
    for name in ("allowed_model_uris", "model_stores"):  # repeatable flags, added to the environment's list
        if flags[name]:
            flags[name] = ",".join(filter(None, [os.environ.get(f"AGENTFLOW_LLM_{name.upper()}", ""), *flags[name]]))
    settings = from_env(ServerSettings, "LLM_", flags=flags)
    model_dir = smollm2_dir() if args.model in (None, "", "smollm2") else args.model
    if not str(model_dir).startswith("/") and "://" not in str(model_dir):
        model_dir = Path(model_dir).expanduser().resolve()  # the operator's own flag may be relative
    allowed = [str(model_dir), *_listed(settings.model_stores), *_listed(settings.allowed_model_uris)]
    load = version_loader(allowed, max_batch=args.max_batch, dtype=args.dtype)
    versions = Versions(load)
    first = load(args.version or Path(model_dir).name, str(model_dir))
    versions.add(first.version, str(model_dir), engine=first)
    server = make_server(versions, args.served_name, host=args.host, port=args.port, settings=settings)
    serve_in_background(server)
    stop_following = threading.Event()
    if args.follow_versions:
        from agentflow.llm.follow import UNUSED_S, follow_versions

        bus = BusConfig.from_env()
        bus = replace(bus, bootstrap_servers=args.bootstrap) if args.bootstrap else bus
        threading.Thread(target=follow_versions, args=(versions, bus, stop_following),
                         kwargs={"promote": args.follow_versions == "promote",
                                 "keep": 1 if args.follow_versions == "promote" else 3,
                                 "unused_s": 0.0 if args.follow_versions == "promote" else UNUSED_S},
                         name="follow-versions",
                         daemon=True).start()

    def stop():
        stop_following.set()
        server.shutdown()
        versions.close()

    announce_and_wait(stop, service="llm", http_port=server.server_address[1],
                      url=f"http://{args.host}:{server.server_address[1]}/v1", model=args.served_name,
                      version=first.version)
    return 0


_LLM_FLAGS = ("max_tokens", "max_prompt_tokens", "max_body_bytes", "request_timeout_s", "api_token", "admin_token",
              "allowed_model_uris", "model_stores")


def version_loader(allowed: list[str], *, max_batch: int = 8, dtype: str = "float32"):
    """serve-llm's ``load(name, uri) -> engine`` (admin API, --follow-versions): a version, and the base a LoRA
    version applies to, only from the allowed roots."""
    from agentflow.llm.embedded import EmbeddedEngine
    from agentflow.storage import check_allowed

    def load(name: str, uri: str) -> EmbeddedEngine:
        check_allowed(uri, allowed)
        return EmbeddedEngine(_local_path(uri), version=name, max_batch=max_batch, dtype=dtype,
                              allowed_roots=allowed)

    return load


def _listed(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _local_path(uri: str) -> Path:
    """The local folder of a checkpoint URI: a folder, file://FOLDER, or any fsspec URI (s3://...), downloaded into
    the model cache (agentflow.storage); it must be a model folder (config.json) or a LoRA version (adapter)."""
    from agentflow.llm.models import ADAPTER_CONFIG
    from agentflow.storage import local_copy
    from agentflow.versions import CHECKPOINT_METADATA

    path = local_copy(uri, marker=CHECKPOINT_METADATA)
    if not any((path / name).is_file() for name in ("config.json", ADAPTER_CONFIG)):
        raise InvalidInput(f"{uri} is not a model folder: it has no config.json (nor {ADAPTER_CONFIG})")
    return path


def _profiles() -> tuple[str, ...]:
    from agentflow.envs.profiles import PROFILES

    return tuple(PROFILES)


def add_parsers(commands) -> None:
    serve_parser = commands.add_parser("serve", help="run one service (gRPC + Kafka worker) until SIGTERM")
    serve_parser.add_argument("name", choices=SERVICES + OPTIONAL_SERVICES + ("retriever",))
    serve_parser.add_argument("--port", type=cli_args.port(),
                              help="gRPC port (retriever: HTTP) (default AGENTFLOW_RPC_PORT or 0: any free port)")
    serve_parser.add_argument("--host", type=cli_args.text(), help="gRPC bind address (default 127.0.0.1)")
    serve_parser.add_argument("--bootstrap", type=cli_args.addresses,
                              help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    serve_parser.add_argument("--endpoint", type=cli_args.url,
                              help="OpenAI-compatible LLM URL for the modules (…/v1)")
    serve_parser.add_argument("--planner-endpoint", type=cli_args.url, help="a separate LLM URL for the planner")
    serve_parser.add_argument("--tools", type=cli_args.names(tool_names),
                              help="comma-separated tools (default python,search,generalist)")
    serve_parser.add_argument("--concurrency", type=cli_args.integer(1), default=8,
                              help="events handled at once (LLM batching)")
    serve_parser.add_argument("--metrics-port", type=cli_args.port(),
                              help="serve Prometheus /metrics on this port (0: any)")
    serve_parser.add_argument("--profile", type=cli_args.names(_profiles, one=True),
                              help="llm (default) or tiny-deterministic (AGENTFLOW_PROFILE)")
    serve_parser.add_argument("--environment", type=cli_args.matching(r"synthetic(:-?\d+)?", "synthetic[:SEED]"),
                              help="'synthetic[:SEED]': its corpus and knowledge for the tools "
                                   "(AGENTFLOW_ENVIRONMENT)")
    serve_parser.add_argument("--index", type=cli_args.uri_or(cli_args.folder),
                              help="retriever: the index folder or fsspec URI that `agentflow index build` wrote "
                                   "(default: the bundled corpus, indexed on first use)")
    serve_parser.add_argument("--api-token", type=cli_args.text(),
                              help="retriever: bearer token /search requires (AGENTFLOW_RETRIEVER_TOKEN keeps it out "
                                   "of ps)")
    serve_parser.set_defaults(handler=serve)

    llm = commands.add_parser("serve-llm", help="an OpenAI-compatible endpoint over the embedded engine")
    llm.add_argument("--model", type=cli_args.uri_or(cli_args.folder, words=("smollm2",)),
                     help="model folder or fsspec URI, e.g. s3://... (default: SmolLM2-135M-Instruct)")
    llm.add_argument("--served-name", default="agentflow", type=cli_args.text(), help="the model name clients send")
    llm.add_argument("--version", type=cli_args.text(),
                     help="the version reported with every response (default: the folder name)")
    llm.add_argument("--host", default="127.0.0.1", type=cli_args.text())
    llm.add_argument("--port", type=cli_args.port(), default=0)
    llm.add_argument("--max-batch", type=cli_args.integer(1), default=8)
    llm.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    llm.add_argument("--admin-token", type=cli_args.text(),
                     help="bearer token the admin API requires; without one the admin API is off "
                          "(AGENTFLOW_LLM_ADMIN_TOKEN; the environment keeps it out of ps)")
    llm.add_argument("--api-token", type=cli_args.text(),
                     help="bearer token the chat routes require (AGENTFLOW_LLM_API_TOKEN; default: none, the routes "
                          "are open)")
    llm.add_argument("--max-tokens", type=cli_args.integer(1),
                     help="largest max_tokens a request may ask for (default 2048)")
    llm.add_argument("--max-prompt-tokens", type=cli_args.integer(1), help="longest prompt in tokens (default 8192)")
    llm.add_argument("--max-body-bytes", type=cli_args.integer(1), help="largest request body (default 4 MiB)")
    llm.add_argument("--request-timeout-s", type=cli_args.number(0, lo_open=True),
                     help="deadline of a chat request (default 300)")
    llm.add_argument("--model-store", dest="model_stores", action="append", type=cli_args.text(),
                     help="a model store root whose versions may be loaded (repeatable; AGENTFLOW_LLM_MODEL_STORES)")
    llm.add_argument("--allow-model-uri", dest="allowed_model_uris", action="append", type=cli_args.text(),
                     help="a folder or URI prefix versions may be loaded from (repeatable; "
                          "AGENTFLOW_LLM_ALLOWED_MODEL_URIS); --model's folder is always allowed")
    llm.add_argument("--follow-versions", nargs="?", const="promote", choices=["promote", "load"],
                     help="load every version announced on planner.versions; promote (the default): send it all "
                          "traffic (training); load: leave the weights to a rollout controller")
    llm.add_argument("--bootstrap", type=cli_args.addresses,
                     help="Kafka for --follow-versions (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    llm.set_defaults(handler=serve_llm)
