"""`agentflow demo`: its flags (``add_parser``) and the command (``demo``), which runs ``agentflow.demo.run.Demo``."""

from __future__ import annotations

import json
import signal

from agentflow import cli_args
from agentflow.demo.settings import DEFAULT_OUT, SERVING, TRAFFIC_QPS, DemoSettings


def demo(args) -> int:
    import logging

    from agentflow.demo.run import Demo  # torch and the clients load only when a demo runs

    logging.getLogger("kafka").setLevel(logging.ERROR)  # the demo's own readers: a loaded machine makes them chatty
    settings = DemoSettings(profile=args.profile, duration_s=args.duration, target=args.target,
                            inject_bad_version=args.inject_bad_version, out=str(args.out), seed=args.seed,
                            traffic_qps=args.traffic_qps, dashboard=not args.no_dashboard, serving=args.serving,
                            unlabeled=args.unlabeled, rated_share=args.rated_share, rating_noise=args.rating_noise,
                            hostile_raters=args.hostile_raters, canary_percent=args.canary_percent)
    runner = Demo(settings)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # as Ctrl-C (while starting; then see Demo._watch)
    paths = runner.run()
    summary = runner.state["summary"]
    print(json.dumps({"event": "demo_done", **summary, "report": paths.get("html"), "json": paths.get("json")}),
          flush=True)
    return 0


def add_parser(commands) -> None:
    p = commands.add_parser("demo", help="the whole loop on one machine: serving, online retraining, canaries")
    p.add_argument("--profile", default="tiny", choices=["tiny", "smol"],
                   help="tiny: a tiny random planner, rule-based frozen modules (minutes); smol: SmolLM2 everywhere")
    p.add_argument("--duration", type=cli_args.number(60), default=840.0,
                   help="stop after this many seconds at the latest")
    p.add_argument("--target", type=cli_args.number(0, 1, lo_open=True), default=0.8,
                   help="stop once a promoted version reaches this held-out success")
    p.add_argument("--inject-bad-version", action="store_true",
                   help="publish a degraded checkpoint mid-run to show an automatic rollback")
    p.add_argument("--out", default=DEFAULT_OUT, type=cli_args.out_folder, help="report, logs, traces and checkpoints")
    p.add_argument("--seed", type=cli_args.integer(), default=0)
    p.add_argument("--traffic-qps", type=cli_args.number(0, lo_open=True), default=TRAFFIC_QPS,
                   help="production queries per second (a slower rate stretches the canary's time limits)")
    p.add_argument("--no-dashboard", action="store_true", help="print progress lines instead of the dashboard")
    p.add_argument("--serving", default="local", choices=SERVING,
                   help="local: one LLM server holds every version; separate: each version on its own server "
                        "process; lora: versions as LoRA adapters on one server (docs/demo.md)")
    p.add_argument("--canary-percent", type=cli_args.integer(1, 99), default=None,
                   help="a canary's first share of the traffic, then 50 %% and 100 %% (default: 25; 50 with "
                        "--unlabeled); more traffic decides sooner")
    p.add_argument("--unlabeled", action="store_true",
                   help="production traffic without ground truth: trained from user feedback and group votes")
    p.add_argument("--rated-share", type=cli_args.number(0, 1), default=0.3,
                   help="--unlabeled: share of answers users rate")
    p.add_argument("--rating-noise", type=cli_args.number(0, 0.5, hi_open=True), default=0.2,
                   help="--unlabeled: share of ratings that are wrong")
    p.add_argument("--hostile-raters", type=cli_args.number(0, 1, hi_open=True), default=0.0,
                   help="--unlabeled: share of the simulated users who rate every answer the wrong way on purpose")
    p.set_defaults(handler=demo)
