"""``agentflow rollout``: run the rollout controller until SIGTERM. Flags override ``AGENTFLOW_ROLLOUT_*``."""

from __future__ import annotations

from dataclasses import replace

#: flag -> settings field (flags left unset keep the environment's value or the default)
_FLAGS = {
    "backend": "backend", "llm_admin_url": "llm_url", "namespace": "namespace", "isvc": "inference_service",
    "canary_percent": "canary_percent", "steps": "steps", "min_samples": "min_samples", "alpha": "alpha",
    "timeout_s": "timeout_s", "timeout_action": "timeout_action", "reward_margin": "reward_margin",
    "error_margin": "error_margin", "latency_ratio": "latency_ratio", "latency_cap_s": "latency_cap_s",
    "reward_source": "reward_source", "metrics_port": "metrics_port", "kserve_mode": "kserve_mode",
    "deployment": "deployment", "serving_url": "serving_url", "pin_endpoint": "pin_endpoint", "drain_s": "drain_s",
    "supersede_s": "supersede_s", "tripwire_min_samples": "tripwire_min_samples", "fleet_url": "fleet_url",
    "fleet_kind": "fleet_kind", "fleet_slots": "fleet_slots", "fleet_serving_url": "fleet_serving_url",
}


def add_parser(commands) -> None:
    from agentflow.rollout.settings import REWARD_SOURCES

    parser = commands.add_parser("rollout", help="canary new planner versions and promote or roll them back by "
                                                 "measured reward (docs/rollout.md)")
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS)")
    parser.add_argument("--backend", choices=["local", "separate", "lora", "kserve"],
                        help="where versions are served (default local)")
    parser.add_argument("--kserve-mode", choices=["canary", "pair"], help="kserve: one InferenceService with "
                        "canaryTrafficPercent and tag routes (Serverless), or a stable and a canary one (either mode)")
    parser.add_argument("--deployment", help="the routing table's key on planner.routing (default planner)")
    parser.add_argument("--serving-url", help="local, lora: the OpenAI base URL callers use (default LLM URL + /v1)")
    parser.add_argument("--pin-endpoint", help="where calls pinned to a version without a route go")
    parser.add_argument("--drain-s", type=float, help="seconds a withdrawn version stays routed for the "
                                                      "trajectories on it (default 150)")
    parser.add_argument("--fleet-url", help="the rollout fleet's server: it holds the newest versions for training "
                                            "rollouts, never users' traffic (docs/rollout.md, 'The rollout fleet')")
    parser.add_argument("--fleet-kind", choices=["lora", "local"], help="lora: adapters through vLLM's runtime LoRA "
                        "API; local: agentflow serve-llm's admin API (default: lora with --backend lora, else local)")
    parser.add_argument("--fleet-slots", type=int, help="versions the fleet holds (default 5; at least the "
                                                        "trainer's max staleness + 1)")
    parser.add_argument("--fleet-serving-url", help="the OpenAI base URL of the fleet for rollouts (default: "
                                                    "--fleet-url + /v1)")
    parser.add_argument("--llm-admin-url", help="local: base URL of agentflow serve-llm (its /admin API); separate: "
                                                "two or more, comma-separated; lora: of the vLLM server")
    parser.add_argument("--namespace", help="kserve: namespace of the InferenceService")
    parser.add_argument("--isvc", help="kserve: name of the planner InferenceService")
    parser.add_argument("--canary-percent", type=int, help="first step's traffic percent (default 10)")
    parser.add_argument("--steps", help="canary percents, comma-separated, ending at 100 (default 10,50,100)")
    parser.add_argument("--min-samples", type=int, help="trajectories per arm (and per step) before deciding")
    parser.add_argument("--alpha", type=float, help="error budget of the sequential test (default 0.05)")
    parser.add_argument("--timeout-s", type=float, help="seconds a step may take before the timeout action")
    parser.add_argument("--timeout-action", choices=["rollback", "promote"], help="on timeout (default rollback)")
    parser.add_argument("--supersede-s", type=float, help="an undecided canary yields to a newer waiting version "
                                                          "after this many seconds in its step (default 0: never)")
    parser.add_argument("--reward-margin", type=float, help="non-inferiority margin on the mean reward")
    parser.add_argument("--error-margin", type=float, help="tolerated increase of the error rate")
    parser.add_argument("--latency-ratio", type=float, help="'much slower' above this multiple of stable latency")
    parser.add_argument("--latency-cap-s", type=float, help="latencies are clipped here (seconds); a lower cap "
                                                            "resolves the latency test with fewer samples")
    parser.add_argument("--reward-source", choices=REWARD_SOURCES, help="reward compared (feedback = human)")
    parser.add_argument("--tripwire-min-samples", type=int, help="trajectories per arm before a tripwire can fire "
                                                                 "(default 100; 0: tripwires off; bounds: "
                                                                 "AGENTFLOW_ROLLOUT_TRIPWIRE_*)")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics here (0: any free port)")
    parser.set_defaults(handler=run)


def settings_from(args, environ=None):
    """``AGENTFLOW_ROLLOUT_*`` with the flags given on top, validated once (a flag may complete the environment)."""
    from agentflow.config import from_env
    from agentflow.rollout.settings import RolloutSettings

    flags = {field: getattr(args, flag, None) for flag, field in _FLAGS.items()}
    return from_env(RolloutSettings, "ROLLOUT_", environ=environ, flags=flags)


def run(args) -> int:
    from agentflow import telemetry
    from agentflow.bus.config import BusConfig
    from agentflow.rollout.service import RolloutService
    from agentflow.services.serving import announce_and_wait

    settings = settings_from(args)
    telemetry.setup_tracing("agentflow-rollout")
    bus = BusConfig.from_env()
    if args.bootstrap:
        bus = replace(bus, bootstrap_servers=args.bootstrap)
    service = RolloutService(settings, bus).start()
    metrics_port = None
    if settings.metrics_port >= 0:
        metrics_port = telemetry.serve_metrics(settings.metrics_port, settings.metrics_host)
    announce_and_wait(service.stop, service="rollout", backend=service.backend.kind, target=service.backend.target,
                      metrics_port=metrics_port)
    return 0
