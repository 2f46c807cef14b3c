"""`agentflow serve NAME` and `agentflow serve-llm`: one process each, configured from flags and AGENTFLOW_* env.

Each prints one JSON line on stdout once it listens (``{"service": ..., "grpc_port": ...}``) so a supervisor (such
as `agentflow up`) can learn the ports it picked, then runs until SIGTERM/SIGINT and drains.
"""

from __future__ import annotations

import json
from dataclasses import replace

from agentflow import telemetry
from agentflow.bus.config import BusConfig
from agentflow.config import EngineSettings, from_env
from agentflow.flow.loop import LoopConfig
from agentflow.rpc.server import RpcConfig, run_until_signalled

SERVICES = ("gateway", "memory", "planner", "executor", "verifier", "generator")
MODULE_SERVICES = ("planner", "executor", "verifier", "generator")


def announce(**fields) -> None:
    print(json.dumps(fields), flush=True)


def build_service(name: str, engine_settings: EngineSettings, planner_settings: EngineSettings, bus: BusConfig,
                  loop: LoopConfig, tools: list[str]):
    """The service object and its gRPC service name."""
    import importlib

    module = importlib.import_module(f"agentflow.services.{name}")
    if name == "memory":
        return module.MemoryService(loop), module.GRPC_SERVICE
    if name == "gateway":
        from agentflow.services.gateway import GatewayConfig

        return module.Gateway(bus, loop, from_env(GatewayConfig, "GATEWAY_")), module.GRPC_SERVICE
    from agentflow.flow.build import build_agent
    from agentflow.llm import build_engine

    engine = build_engine(engine_settings)
    planner_engine = engine if planner_settings == engine_settings else build_engine(planner_settings)
    agent = build_agent(engine, tools, loop, planner_engine=planner_engine, call_timeout_s=engine_settings.timeout_s)
    service_class = {"planner": "PlannerService", "executor": "ExecutorService", "verifier": "VerifierService",
                     "generator": "GeneratorService"}[name]
    return getattr(module, service_class)(agent), module.GRPC_SERVICE


def serve(args) -> int:
    from agentflow.runtime import ServiceRunner
    from agentflow.tools.registry import DEFAULT_TOOLS

    name = args.name
    telemetry.setup_tracing(f"agentflow-{name}")
    telemetry.instrument_grpc_clients()
    bus = BusConfig.from_env()
    if args.bootstrap:
        bus = replace(bus, bootstrap_servers=args.bootstrap)
    rpc = replace(from_env(RpcConfig, "RPC_"), **({"port": args.port} if args.port is not None else {}),
                  **({"host": args.host} if args.host else {}))
    engine = from_env(EngineSettings)
    if args.endpoint:
        engine = replace(engine, engine="openai", endpoint=args.endpoint)
    planner = from_env(EngineSettings, "PLANNER_", engine)
    if args.planner_endpoint:
        planner = replace(planner, engine="openai", endpoint=args.planner_endpoint)
    tools = [t for t in (args.tools or ",".join(DEFAULT_TOOLS)).split(",") if t]
    service, grpc_name = build_service(name, engine, planner, bus, from_env(LoopConfig, "LOOP_"), tools)
    runner = ServiceRunner(service, grpc_name, rpc, bus, concurrency=args.concurrency).start()
    metrics_port = telemetry.serve_metrics(args.metrics_port, rpc.host) if args.metrics_port is not None else None
    announce(service=name, grpc_port=runner.port, metrics_port=metrics_port)
    run_until_signalled(runner.stop)
    return 0


def serve_llm(args) -> int:
    from agentflow.llm.embedded import EmbeddedEngine
    from agentflow.llm.models import smollm2_dir
    from agentflow.llm.server import make_server, serve_in_background

    model_dir = smollm2_dir() if args.model in (None, "", "smollm2") else args.model
    engine = EmbeddedEngine(model_dir, version=args.version or "", max_batch=args.max_batch, dtype=args.dtype)
    server = make_server(engine, args.served_name, engine.version, args.host, args.port)
    serve_in_background(server)
    announce(service="llm", http_port=server.server_address[1], url=f"http://{args.host}:{server.server_address[1]}/v1",
             model=args.served_name, version=engine.version)

    def stop():
        server.shutdown()
        engine.close()

    run_until_signalled(stop)
    return 0


def add_parsers(commands) -> None:
    serve_parser = commands.add_parser("serve", help="run one service (gRPC + Kafka worker) until SIGTERM")
    serve_parser.add_argument("name", choices=SERVICES)
    serve_parser.add_argument("--port", type=int, help="gRPC port (default AGENTFLOW_RPC_PORT or 0: any free port)")
    serve_parser.add_argument("--host", help="gRPC bind address (default 127.0.0.1)")
    serve_parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    serve_parser.add_argument("--endpoint", help="OpenAI-compatible LLM URL for the modules (…/v1)")
    serve_parser.add_argument("--planner-endpoint", help="a separate LLM URL for the planner")
    serve_parser.add_argument("--tools", help="comma-separated tools (default python,search,generalist)")
    serve_parser.add_argument("--concurrency", type=int, default=8, help="events handled at once (LLM batching)")
    serve_parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (0: any)")
    serve_parser.set_defaults(handler=serve)

    llm = commands.add_parser("serve-llm", help="an OpenAI-compatible endpoint over the embedded engine")
    llm.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct)")
    llm.add_argument("--served-name", default="agentflow", help="the model name clients send")
    llm.add_argument("--version", help="the version reported with every response (default: the folder name)")
    llm.add_argument("--host", default="127.0.0.1")
    llm.add_argument("--port", type=int, default=0)
    llm.add_argument("--max-batch", type=int, default=8)
    llm.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    llm.set_defaults(handler=serve_llm)
