"""The `agentflow` command; nothing is parsed at import time.

Exit status: 0 done; 2 a user mistake or a dead dependency (one line on stderr: a flag refused as it is parsed names
itself, ``agentflow run: error: argument --max-steps: ...``, with nothing loaded or started; other mistakes are
``agentflow: error: ...``); 3 the query ran out of time (``run`` and ``ask`` still print what they have); 130
interrupted. Every flag is checked by its ``type=`` (``agentflow.cli_args``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from agentflow import __version__, cli_args, cpus
from agentflow.errors import AgentFlowError, EngineError, InvalidInput
from agentflow.tools import tool_names

EXIT_USAGE = 2
EXIT_TIMEOUT = 3
GATEWAY_HELP = ("gateway host:port (default: $AGENTFLOW_GATEWAY, else the one a running `agentflow up` started, "
                "else 127.0.0.1:50051)")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cpus.default_threads()  # before torch loads: one OpenMP thread per CPU this process may use (agentflow/cpus.py)
    from agentflow.telemetry.logs import configure_logging

    configure_logging(args.verbose)  # text or JSON lines (AGENTFLOW_LOG_FORMAT), secrets redacted
    try:
        return args.handler(args)
    except AgentFlowError as e:
        print(f"agentflow: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a file or an address the flags named, found unusable only when used
        logging.getLogger(__name__).debug("the OSError in full", exc_info=True)
        where = f"{e.filename}: " if e.filename else ""
        print(f"agentflow: error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("agentflow: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = cli_args.ArgumentParser(prog="agentflow",
                                     description="A trainable planner-executor-verifier-generator agent.")
    parser.add_argument("--version", action="version", version=f"agentflow {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (model loading, retries)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="solve one query in-process and print every step")
    run.add_argument("query", nargs="?", help="the question (or use --file)")
    run.add_argument("--file", type=cli_args.readable_file, help="read the question from a UTF-8 text file")
    run.add_argument("--json", action="store_true", help="print the full trajectory record as JSON on stdout")
    run.add_argument("--engine", choices=["embedded", "openai"], help="LLM engine for every module (default: embedded)")
    run.add_argument("--model", type=cli_args.text(),
                     help="embedded: model folder or 'smollm2' (default); openai: served model name")
    run.add_argument("--endpoint", type=cli_args.url,
                     help="openai: base URL including /v1, e.g. http://127.0.0.1:8000/v1")
    run.add_argument("--api-key", type=cli_args.text(), help="openai: bearer token")
    run.add_argument("--dtype", choices=["float32", "bfloat16", "auto"],
                     help="embedded: weights' precision (default auto: bfloat16 where the CPU has AVX512-BF16/AMX)")
    run.add_argument("--planner-endpoint", type=cli_args.url, help="openai: a separate server for the planner")
    run.add_argument("--planner-model", type=cli_args.text(), help="the planner's model, when it differs")
    run.add_argument("--max-steps", type=cli_args.integer(1), help="planner turns at most (default 5)")
    run.add_argument("--max-time", type=cli_args.number(0, lo_open=True),
                     help="seconds for the whole query, answer included (default 120)")
    run.add_argument("--tools", type=cli_args.names(tool_names),
                     help="comma-separated tool names (default python,search,generalist)")
    run.add_argument("--corpus", type=cli_args.jsonl_file,
                     help="JSONL corpus for the search tool (default: the bundled one)")
    run.add_argument("--retriever", metavar="URL", type=cli_args.url,
                     help="the search tool queries this dense retriever (`agentflow serve retriever`) instead of BM25")
    run.add_argument("--temperature", type=cli_args.number(0), default=0.0,
                     help="planner sampling temperature (default 0)")
    run.add_argument("--ground-truth", default="", help="stored in the record for later scoring")
    run.add_argument("--no-save", action="store_true",
                     help="do not keep the record in .agentflow/runs (where `agentflow trace show ID` finds it)")
    run.set_defaults(handler=_run)

    model = commands.add_parser("model", help="prepare local model folders")
    which = model.add_subparsers(dest="which", required=True)
    tiny = which.add_parser("tiny", help="build a random-init tiny Qwen2-style model and tokenizer (seconds)")
    tiny.add_argument("--out", type=cli_args.out_folder, required=True, help="folder to write")
    tiny.add_argument("--seed", type=cli_args.integer(0), default=0)
    tiny.set_defaults(handler=_model_tiny)
    smol = which.add_parser("smollm2", help="convert the packaged SmolLM2-135M-Instruct once; print its folder")
    smol.set_defaults(handler=_model_smollm2)

    tools = commands.add_parser("tools", help="list the tools and what the prompts say about them")
    tools.set_defaults(handler=_tools)

    env = commands.add_parser("env", help="print this machine's and this install's set-up, for a bug report")
    env.add_argument("--json", action="store_true", help="one JSON object, section by section")
    env.set_defaults(handler=_env)

    ask = commands.add_parser("ask", help="send a question to a running gateway")
    ask.add_argument("query", type=cli_args.text(), help="the question")
    ask.add_argument("--gateway", type=cli_args.address, help=GATEWAY_HELP)
    ask.add_argument("--stream", action="store_true", help="print each step as it happens")
    ask.add_argument("--json", action="store_true", help="print the trajectory record as JSON")
    ask.add_argument("--api-key", type=cli_args.text(), help="sent as x-api-key")
    ask.add_argument("--max-steps", type=cli_args.integer(0), default=0,
                     help="planner turns (0: the gateway's default)")
    ask.add_argument("--max-time", type=cli_args.number(0), default=0.0, help="seconds (0: the gateway's default)")
    ask.add_argument("--timeout", type=cli_args.number(0, lo_open=True), default=600.0,
                     help="client deadline in seconds")
    ask.set_defaults(handler=_ask)

    feedback = commands.add_parser("feedback", help="rate an answer a running gateway gave (docs/rewards.md)")
    feedback.add_argument("trajectory_id", type=cli_args.text(), help="the trajectory id the answer came with")
    rating = feedback.add_mutually_exclusive_group(required=True)
    rating.add_argument("--score", type=cli_args.number(0, 1), help="a score in [0, 1]")
    rating.add_argument("--up", action="store_true", help="the answer is right (score 1)")
    rating.add_argument("--down", action="store_true", help="the answer is wrong (score 0)")
    feedback.add_argument("--comment", default="", type=cli_args.text(2000, empty=True),  # the gateway's limit
                          help="why (at most 2000 characters)")
    feedback.add_argument("--labeller", default="", help="the person you rate for (an identity only for a key with "
                                                         "the delegate scope; otherwise a note)")
    feedback.add_argument("--gateway", type=cli_args.address, help=GATEWAY_HELP)
    feedback.add_argument("--api-key", type=cli_args.text(), help="sent as x-api-key")
    feedback.set_defaults(handler=_feedback)

    keys = commands.add_parser("keys", help="make gateway API keys (docs/deploy.md, \"API keys\")")
    keys_which = keys.add_subparsers(dest="which", required=True)
    new = keys_which.add_parser("new", help="a new random key and the hashed entry the gateway keeps for it")
    new.add_argument("name", help="who holds it (1-64 of A-Z a-z 0-9 . _ -): the rater and owner the gateway records")
    new.add_argument("--scopes", default="solve,feedback", type=cli_args.names(_scopes),
                     help="comma-separated: solve, feedback, train, review, delegate (default: solve,feedback)")
    new.set_defaults(handler=_keys_new)

    from agentflow.services import cluster, serving
    from agentflow.trainer import cli as trainer_cli
    from agentflow.eval.cli import add_eval_parser
    from agentflow.eval.trace_cli import add_trace_parser
    from agentflow.demo.cli import add_parser as add_demo_parser
    from agentflow.rollout.cli import add_parser as add_rollout_parser
    from agentflow.retrieval.cli import add_index_parser
    from agentflow.status import add_parser as add_status_parser

    serving.add_parsers(commands)
    cluster.add_parser(commands)
    trainer_cli.add_parsers(commands)
    add_eval_parser(commands)
    add_trace_parser(commands)
    add_rollout_parser(commands)
    add_demo_parser(commands)
    add_status_parser(commands)
    add_index_parser(commands)
    _accept_everywhere(commands, "-v", "--verbose")
    return parser


def _scopes() -> tuple[str, ...]:
    from agentflow.services.gateway.keys import SCOPES

    return SCOPES


def _accept_everywhere(commands, *flags: str) -> None:
    """Let a global flag also follow the subcommand (``agentflow run -v ...``), at every level of subcommands.
    SUPPRESS as the default: a subcommand that does not see the flag leaves the top-level value alone."""
    for sub in set(commands.choices.values()):
        if not any(flag in sub._option_string_actions for flag in flags):
            sub.add_argument(*flags, action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_everywhere(action, *flags)


def _read_query(args) -> str:
    if args.query is not None and args.file is not None:
        raise InvalidInput("give the question as an argument or with --file, not both")
    if args.file is None:
        if args.query is None:
            raise InvalidInput("no question given (agentflow run \"QUESTION\" or --file FILE)")
        return args.query
    try:
        data = args.file.read_bytes()
    except OSError as e:
        raise InvalidInput(f"cannot read {args.file}: {e.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{args.file} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start})") from None


def _run(args) -> int:
    from agentflow.config import EngineSettings, from_env
    from agentflow.flow.build import build_agent
    from agentflow.flow.loop import LoopConfig, validate_query
    from agentflow.llm import build_engine
    from agentflow.tools.registry import select_tools

    loop = LoopConfig(**{k: v for k, v in {"max_steps": args.max_steps, "max_time_s": args.max_time}.items()
                         if v is not None})
    query = validate_query(_read_query(args), loop.max_query_bytes)  # fail before loading a model
    tool_names, tools_config = select_tools(args.tools, corpus=args.corpus, retriever=args.retriever)
    flags = {"engine": args.engine, "model": args.model, "endpoint": args.endpoint, "api_key": args.api_key,
             "dtype": args.dtype or (None if "AGENTFLOW_DTYPE" in os.environ else "auto")}  # inference only
    shared = from_env(EngineSettings, flags=flags)
    planner_flags = {"endpoint": args.planner_endpoint, "model": args.planner_model}
    planner = from_env(EngineSettings, "PLANNER_", shared, flags=planner_flags)

    from agentflow.trace_view import TracePrinter

    printer = TracePrinter(stream=sys.stderr if args.json else sys.stdout)
    printer.status(f"loading the {shared.engine} engine …")
    engines = [build_engine(shared)]
    try:
        if planner != shared:
            engines.append(build_engine(planner))
        agent = build_agent(engines[0], tool_names, loop, planner_engine=engines[-1],
                            planner_temperature=args.temperature, call_timeout_s=shared.timeout_s,
                            tools_config=tools_config)
        printer.query(query, tool_names, loop)
        try:
            record = agent.solve(query, ground_truth=args.ground_truth, on_event=printer.event)
        except EngineError as e:  # keep what was done: the partial record still goes to stdout
            if getattr(e, "record", None):
                _keep(e.record, args, printer)
                if args.json:
                    print(json.dumps(e.record, ensure_ascii=False))
            raise
    finally:
        printer.close()
        for engine in engines:
            _shut_down(engine)
    printer.summary(record)
    _keep(record, args, printer)
    if args.json:
        print(json.dumps(record, ensure_ascii=False))
    return EXIT_TIMEOUT if record["status"] == "timeout" else 0


def _keep(record: dict, args, printer) -> None:
    """Save the record for `agentflow trace show`, unless --no-save; a folder that cannot be written costs a warning,
    never the answer."""
    from agentflow.eval.trace_cli import save_run

    if args.no_save:
        return
    try:
        path = save_run(record)
    except OSError as e:
        printer.status(f"record not kept: {e}")
        return
    printer.status(f"record kept in {path} (agentflow trace show {record['trajectory_id']})")


def _shut_down(engine) -> None:
    """Close ``engine`` now: an embedded engine's worker must end before the interpreter does (or exit is 134)."""
    from agentflow.llm.embedded import EmbeddedEngine

    if isinstance(engine, EmbeddedEngine):
        engine.close(cancel=True)
    elif hasattr(engine, "close"):
        engine.close()


def _model_tiny(args) -> int:
    from agentflow.llm.models import build_tiny

    print(build_tiny(args.out, seed=args.seed))
    return 0


def _model_smollm2(args) -> int:
    from agentflow.llm.models import smollm2_dir

    print(smollm2_dir())
    return 0


def _tools(args) -> int:
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.tools.registry import available_tool_names, build_tools

    tools = build_tools(available_tool_names(), engine=ScriptedEngine(["(the generalist's engine)"]))
    for tool in tools.values():
        print(tool.spec.card())
    return 0


def _env(args) -> int:
    from agentflow.diagnostics import collect, render

    report = collect()
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else render(report))
    return 0


def _ask(args) -> int:
    import grpc

    from agentflow.domain.convert import record_from_proto
    from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc
    from agentflow.rpc.client import channel

    from agentflow.services.cluster import gateway_address

    args.gateway = gateway_address(args.gateway)
    request = gateway_pb2.SolveRequest(query=args.query, options=events_pb2.QueryOptions(
        max_steps=args.max_steps, max_time_s=args.max_time))
    metadata = [("x-api-key", args.api_key)] if args.api_key else []
    with channel(args.gateway) as ch:
        stub = gateway_pb2_grpc.AgentFlowStub(ch)
        try:
            if args.stream:
                for event in stub.SolveStream(request, timeout=args.timeout, metadata=metadata):
                    print(event.summary, flush=True)
                return 0
            response = stub.Solve(request, timeout=args.timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise AgentFlowError(f"{args.gateway}: {e.code().name}: {e.details()}") from None
    if args.json:
        print(json.dumps(record_from_proto(response.trajectory), ensure_ascii=False))
    else:
        print(f"{response.answer}\n({response.status}, trajectory {response.trajectory_id})")
    return EXIT_TIMEOUT if response.status == "timeout" else 0


def _feedback(args) -> int:
    import grpc

    from agentflow.proto.v1 import gateway_pb2, gateway_pb2_grpc
    from agentflow.rpc.client import channel

    from agentflow.services.cluster import gateway_address

    args.gateway = gateway_address(args.gateway)
    request = gateway_pb2.FeedbackRequest(trajectory_id=args.trajectory_id, comment=args.comment,
                                          labeller=args.labeller)
    if args.score is not None:
        request.score = args.score
    else:
        request.thumbs_up = bool(args.up)
    metadata = [("x-api-key", args.api_key)] if args.api_key else []
    with channel(args.gateway) as ch:
        try:
            response = gateway_pb2_grpc.AgentFlowStub(ch).Feedback(request, timeout=30, metadata=metadata)
        except grpc.RpcError as e:
            raise AgentFlowError(f"{args.gateway}: {e.code().name}: {e.details()}") from None
    print(json.dumps({"trajectory_id": response.trajectory_id, "event_id": response.event_id}))
    return 0


def _keys_new(args) -> int:
    from agentflow.services.gateway.keys import new_key

    key, entry = new_key(args.name, args.scopes.split(","))
    print(json.dumps({"name": args.name, "key": key, "entry": entry}))
    print(f"Give the key to {args.name} (it is shown only now) and add the entry to the gateway's keys "
          "(AGENTFLOW_GATEWAY_API_KEYS, comma-separated; in the chart the Secret gateway.apiKeysSecret).",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
