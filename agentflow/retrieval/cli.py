"""`agentflow index build` and the body of `agentflow serve retriever` (wired into ``agentflow.cli``)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from agentflow import cli_args
from agentflow.errors import AgentFlowError
from agentflow.retrieval.index import KINDS

EXIT_USAGE = 2
TOKEN_ENV = "AGENTFLOW_RETRIEVER_TOKEN"


def add_index_parser(commands) -> None:
    """``index build --corpus PATH_OR_URI --out URI [--kind auto|flat|hnsw]`` under ``commands`` (argparse
    subparsers); the handler is ``build_command``."""
    index = commands.add_parser("index", help="build dense retrieval indexes (docs/retrieval.md)")
    which = index.add_subparsers(dest="index_command", required=True)
    build = which.add_parser("build", help="embed a JSONL corpus ({title, text[, url, id]} per line) into an index")
    build.add_argument("--corpus", required=True, type=cli_args.uri_or(cli_args.jsonl_file),
                       help="JSONL corpus: a path or an fsspec URI (s3://, file://, ...)")
    build.add_argument("--out", required=True, type=cli_args.uri_or(cli_args.out_folder),
                       help="the index folder to write: a path or an fsspec URI")
    build.add_argument("--kind", choices=KINDS, default="auto",
                       help="flat (exact), hnsw (approximate) or auto (flat up to 50,000 passages)")
    build.set_defaults(handler=build_command)


def build_command(args) -> int:
    """Build the index; progress lines on stderr, the meta as one JSON line on stdout; 2 on bad input."""
    from agentflow.retrieval.index import build_index

    def progress(done: int, total: int) -> None:
        print(f"index: embedded {done}/{total} passages", file=sys.stderr, flush=True)

    try:
        meta = build_index(args.corpus, args.out, kind=args.kind, progress=progress)
    except AgentFlowError as e:
        print(f"agentflow: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(meta), flush=True)
    return 0


def load_served_index(uri: str | None):
    """The index at ``uri``, or the bundled corpus's when none is given."""
    from agentflow.retrieval.index import DenseIndex, bundled_index

    return DenseIndex.load(uri) if uri else bundled_index()


def serve_retriever(args) -> int:
    """Serve ``args.index`` (default: the bundled index) on ``args.host``:``args.port`` until SIGTERM or SIGINT.
    The token is ``args.api_token`` or ``$AGENTFLOW_RETRIEVER_TOKEN``; none leaves /search open."""
    from agentflow.retrieval.server import make_server, serve_in_background

    index = load_served_index(getattr(args, "index", None))
    token = getattr(args, "api_token", None) or os.environ.get(TOKEN_ENV, "")
    host, port = getattr(args, "host", None) or "127.0.0.1", getattr(args, "port", None) or 0
    index.embedder  # load the model before announcing the port, so the first query is not the slow one
    server = make_server(index, host, int(port), api_token=token or None)
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    serve_in_background(server)
    bound_host, bound_port = server.server_address[:2]
    print(f"retriever: serving {len(index)} passages on http://{bound_host}:{bound_port}/search"
          f"{' (bearer token required)' if token else ''}", flush=True)
    try:
        while not stop.wait(1.0):  # a timed wait: the signal handler runs between waits
            pass
    finally:
        server.shutdown()
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
