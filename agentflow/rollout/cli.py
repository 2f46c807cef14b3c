"""``agentflow rollout``: run the rollout controller until SIGTERM. Flags override the ``--config`` file, which
overrides ``AGENTFLOW_ROLLOUT_*``; each flag is checked by its setting's ``check``."""

from __future__ import annotations

from dataclasses import replace

from agentflow import cli_args

#: flag -> settings field (flags left unset keep the --config file's value, the environment's or the default)
_FLAGS = {
    "backend": "backend", "llm_admin_url": "llm_url", "namespace": "namespace", "isvc": "inference_service",
    "canary_percent": "canary_percent", "steps": "steps", "min_samples": "min_samples", "alpha": "alpha",
    "timeout_s": "timeout_s", "timeout_action": "timeout_action", "reward_margin": "reward_margin",
    "error_margin": "error_margin", "latency_ratio": "latency_ratio", "latency_cap_s": "latency_cap_s",
    "reward_source": "reward_source", "metrics_port": "metrics_port", "kserve_mode": "kserve_mode",
    "deployment": "deployment", "serving_url": "serving_url", "pin_endpoint": "pin_endpoint", "drain_s": "drain_s",
    "supersede_s": "supersede_s", "supersede_min_rewarded": "supersede_min_rewarded",
    "tripwire_min_samples": "tripwire_min_samples", "fleet_url": "fleet_url",
    "fleet_kind": "fleet_kind", "fleet_slots": "fleet_slots", "fleet_serving_url": "fleet_serving_url",
    "fleet_mirror": "fleet_mirror",
}


def add_parser(commands) -> None:
    from agentflow.config import add_config_flag, flag_check, group_title
    from agentflow.rollout.settings import FLEET_KINDS, REWARD_SOURCES, RolloutSettings

    parser = commands.add_parser("rollout", help="canary new planner versions and promote or roll them back by "
                                                 "measured reward (docs/rollout.md)")
    add_config_flag(parser, RolloutSettings, "AGENTFLOW_ROLLOUT_*", "docs/examples/rollout.toml",
                    extra={"bootstrap": cli_args.addresses},
                    keys="a setting's name is its key (min_samples = 200): a flag's without -- and with _ for -, but "
                         "llm_url for --llm-admin-url and inference_service for --isvc")
    cli_args.argument_group(parser, "connection").add_argument(
        "--bootstrap", type=cli_args.addresses,
        help="Kafka bootstrap servers (default AGENTFLOW_KAFKA_BOOTSTRAP_SERVERS; also a key of the --config file)")

    def add(flag: str, **kw) -> None:  # listed by --help in its setting's section
        field = _FLAGS[flag.removeprefix("--").replace("-", "_")]
        cli_args.argument_group(parser, group_title(RolloutSettings, field)).add_argument(flag, **kw)

    def check(field: str):
        return flag_check(RolloutSettings, field)

    add("--backend", choices=["local", "separate", "lora", "kserve"], help="where versions are served (default local)")
    add("--kserve-mode", choices=["canary", "pair"], help="kserve: one InferenceService with canaryTrafficPercent and "
        "tag routes (Serverless), or a stable and a canary one (either mode)")
    add("--deployment", type=check("deployment"), help="the routing table's key on planner.routing (default planner)")
    add("--serving-url", type=check("serving_url"),
        help="local, lora: the OpenAI base URL callers use (default LLM URL + /v1)")
    add("--pin-endpoint", type=check("pin_endpoint"), help="where calls pinned to a version without a route go")
    add("--drain-s", type=check("drain_s"), help="seconds a withdrawn version stays routed for the trajectories on "
                                                 "it (default 150)")
    add("--fleet-url", type=check("fleet_url"), help="the rollout fleet's server: it holds the newest versions for "
                                                     "training rollouts, never users' traffic (docs/rollout.md, 'The "
                                                     "rollout fleet')")
    add("--fleet-kind", choices=list(FLEET_KINDS), help="lora: adapters through vLLM's runtime LoRA API; local: "
        "agentflow serve-llm's admin API; vllm: full weights replaced in place in a vLLM started for it (default: "
        "lora with --backend lora, else local)")
    add("--fleet-slots", type=check("fleet_slots"), help="versions the fleet holds (default 5; at least the "
                                                         "trainer's max staleness + 1)")
    add("--fleet-serving-url", type=check("fleet_serving_url"), help="the OpenAI base URL of the fleet for rollouts "
                                                                     "(default: --fleet-url + /v1)")
    add("--fleet-mirror", type=check("fleet_mirror"), help="vllm: the folder in the fleet's pod where agentflow "
                                                           "fleet-mirror copies an object store's versions")
    add("--llm-admin-url", type=check("llm_url"), help="local: base URL of agentflow serve-llm (its /admin API); "
                                                       "separate: two or more, comma-separated; lora: of the vLLM "
                                                       "server")
    add("--namespace", type=check("namespace"), help="kserve: namespace of the InferenceService")
    add("--isvc", type=check("inference_service"), help="kserve: name of the planner InferenceService")
    add("--canary-percent", type=check("canary_percent"), help="first step's traffic percent (default 10)")
    add("--steps", type=check("steps"), help="canary percents, comma-separated, ending at 100 (default 10,50,100)")
    add("--min-samples", type=check("min_samples"), help="trajectories per arm (and per step) before deciding")
    add("--alpha", type=check("alpha"), help="error budget of the sequential test (default 0.05)")
    add("--timeout-s", type=check("timeout_s"), help="seconds a step may take before the timeout action")
    add("--timeout-action", choices=["rollback", "promote"], help="on timeout (default rollback)")
    add("--supersede-s", type=check("supersede_s"), help="an undecided canary yields to a newer waiting version "
                                                         "after this many seconds in its step (default 0: never)")
    add("--supersede-min-rewarded", type=check("supersede_min_rewarded"),
        help="and only once the canary has this many rewarded trajectories (default 0)")
    add("--reward-margin", type=check("reward_margin"), help="non-inferiority margin on the mean reward")
    add("--error-margin", type=check("error_margin"), help="tolerated increase of the error rate")
    add("--latency-ratio", type=check("latency_ratio"), help="'much slower' above this multiple of stable latency")
    add("--latency-cap-s", type=check("latency_cap_s"),
        help="latencies are clipped here (seconds); a lower cap resolves the latency test with fewer samples")
    add("--reward-source", choices=REWARD_SOURCES, help="reward compared (feedback = human)")
    add("--tripwire-min-samples", type=check("tripwire_min_samples"),
        help="trajectories per arm before a tripwire can fire (default 100; 0: tripwires off; bounds: "
             "AGENTFLOW_ROLLOUT_TRIPWIRE_* or the --config file)")
    add("--metrics-port", type=check("metrics_port"), help="serve Prometheus /metrics here (0: any free port)")
    parser.set_defaults(handler=run)


def settings_from(args, environ=None):
    """``AGENTFLOW_ROLLOUT_*``, then the ``--config`` file, then the flags given, validated once (a flag may complete
    the environment)."""
    from agentflow.config import from_env
    from agentflow.rollout.settings import RolloutSettings

    flags = {field: getattr(args, flag, None) for flag, field in _FLAGS.items()}
    return from_env(RolloutSettings, "ROLLOUT_", environ=environ, flags=flags, config=getattr(args, "config", None))


def run(args) -> int:
    from agentflow import telemetry
    from agentflow.bus.clients import reach_brokers
    from agentflow.bus.config import BusConfig
    from agentflow.config import flag_or_file
    from agentflow.rollout.service import RolloutService
    from agentflow.services.serving import announce_and_wait

    settings = settings_from(args)
    telemetry.setup_tracing("agentflow-rollout")
    bus, bootstrap = BusConfig.from_env(), flag_or_file(args, "bootstrap")
    if bootstrap:
        bus = replace(bus, bootstrap_servers=bootstrap)
    reach_brokers(bus)
    service = RolloutService(settings, bus).start()
    metrics_port = None
    if settings.metrics_port >= 0:
        metrics_port = telemetry.serve_metrics(settings.metrics_port, settings.metrics_host)
    announce_and_wait(service.stop, service="rollout", backend=service.backend.kind, target=service.backend.target,
                      metrics_port=metrics_port)
    return 0
