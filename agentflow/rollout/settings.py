"""The rollout controller's settings: one typed dataclass, each field settable as ``AGENTFLOW_ROLLOUT_<FIELD>``
(``agentflow.config.from_env(RolloutSettings, "ROLLOUT_")``), as a key of ``agentflow rollout --config FILE.toml``
or by the matching ``agentflow rollout`` flag (checked by the field's ``check``; listed under its ``group``).

The Helm chart sets ``BACKEND``, ``INFERENCE_SERVICE``, ``NAMESPACE``, ``LLM_URL``, ``STEPS`` and ``MIN_SAMPLES``
itself; the rest go through ``rollout.settings`` (keys are upper-cased into these names).
"""

from __future__ import annotations

import os
from argparse import ArgumentTypeError
from dataclasses import dataclass, fields

from agentflow import cli_args
from agentflow.config import setting
from agentflow.errors import InvalidInput
from agentflow.llm.routing import MAX_ROUTES
from agentflow.rollout.policy import Policy
from agentflow.rollout.tripwires import TRIPWIRES, TripwireBounds

BACKENDS = ("local", "separate", "lora", "kserve")
KSERVE_MODES = ("canary", "pair")
FLEET_KINDS = ("local", "lora", "vllm")  # the rollout fleet's servers (agentflow.rollout.fleet)
#: one source of Record.reward (feedback = human), or any: all, by precedence (docs/rewards.md says when each is
#: trustworthy)
REWARD_SOURCES = ("rule", "judge", "human", "feedback", "vote", "any")


def canary_steps(text: str) -> list[int]:
    """The canary percents of ``text``: comma-separated, rising strictly from at least 1, ending at 100; else a
    ValueError saying so."""
    try:
        steps = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError("must be comma-separated integers") from None
    if not steps or steps != sorted(set(steps)) or steps[0] < 1 or steps[-1] != 100:
        raise ValueError("must rise strictly from at least 1 and end at 100")
    return steps


def _steps(text: str) -> str:
    """The ``steps`` checker (flag and config file): ``text`` if ``canary_steps`` takes it."""
    try:
        canary_steps(text)
    except ValueError as e:
        raise ArgumentTypeError(f"{e} (got {text!r})") from None
    return text


KUBE_NAME = cli_args.matching(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", "a Kubernetes name (a-z, 0-9 and -)")
_SHARE = cli_args.number(0, 1, lo_open=True)  # a tripwire's bound on a difference of rates


@dataclass(frozen=True)
class RolloutSettings:
    backend: str = setting("local", "local (agentflow serve-llm's admin API), separate (one serve-llm per version), "
                                    "lora (adapters on one vLLM through its runtime LoRA API) or kserve "
                                    "(InferenceServices)", cli_args.names(BACKENDS, one=True), group="backend")
    llm_url: str = setting("http://127.0.0.1:8000", "local: base URL of agentflow serve-llm (its /admin API); "
                                                    "separate: two or more, comma-separated; lora: base URL of the "
                                                    "vLLM server (a trailing /v1 is dropped)", cli_args.urls,
                           group="backend")
    admin_token: str = setting("", "local, lora: bearer token for the admin API, if it asks for one", group="backend")
    deployment: str = setting("planner", "the routing table's key on planner.routing: callers following this "
                                         "deployment route by its table", cli_args.text(), group="routing")
    serving_url: str = setting("", "local, lora: the OpenAI base URL callers use (default: llm_url + /v1)",
                               cli_args.url, group="routing")
    pin_endpoint: str = setting("", "where calls pinned to a version without a route go (an OpenAI base URL; "
                                    "local: default serving_url, a server that loads every version)", cli_args.url,
                                group="routing")
    fleet_url: str = setting("", "the rollout fleet's server (agentflow.rollout.fleet): base URL of a vLLM with "
                                 "runtime LoRA updating (fleet_kind lora), of agentflow serve-llm (local) or of a "
                                 "vLLM that loads full weights in place (vllm); it holds the newest versions for "
                                 "training rollouts and never serves users; empty: no fleet", cli_args.url,
                             group="rollout fleet")
    fleet_kind: str = setting("", "lora (adapter versions), local (serve-llm's admin API, full weights) or vllm (full "
                                  "weights replaced in place, one version at a time); empty: lora with the lora "
                                  "backend, else local", cli_args.names(FLEET_KINDS, one=True),
                              group="rollout fleet")
    fleet_slots: int = setting(5, "versions the fleet holds, newest first: at least the trainer's max_staleness + 1, "
                                  "and at most the fleet vLLM's --max-loras (vllm: always 1)",
                               cli_args.integer(1, MAX_ROUTES), group="rollout fleet")
    fleet_serving_url: str = setting("", "the OpenAI base URL rollouts use for the fleet (default: fleet_url + /v1)",
                                     cli_args.url, group="rollout fleet")
    fleet_admin_token: str = setting("", "bearer token of the fleet server's admin or LoRA routes (default: "
                                         "admin_token)", group="rollout fleet")
    fleet_mirror: str = setting("", "vllm: the folder in the fleet's pod where the versions of a remote model store "
                                    "appear by name (agentflow fleet-mirror's --into); a version is loaded from "
                                    "<fleet_mirror>/<version> once it is there; empty: from its own URI, a local "
                                    "path", group="rollout fleet")
    kserve_mode: str = setting("canary", "kserve: canary (one InferenceService, canaryTrafficPercent, Serverless "
                                         "mode with tag routing) or pair (a stable and a canary InferenceService, "
                                         "Serverless or Standard mode)", cli_args.names(KSERVE_MODES, one=True),
                               group="backend")
    kserve_openai_path: str = setting("/openai/v1", "kserve: path of the OpenAI routes under an InferenceService's "
                                                    "URL (/openai/v1 for KServe's huggingface runtime, /v1 for a "
                                                    "plain vLLM container)", group="backend")
    namespace: str = setting("default", "kserve: namespace of the InferenceService", KUBE_NAME, group="backend")
    inference_service: str = setting("", "kserve: name of the planner InferenceService", KUBE_NAME, group="backend")
    served_model_name: str = setting("planner", "kserve: the model name clients request; kept as an alias after the "
                                                "version name in --served-model-name", group="backend")
    canary_percent: int = setting(10, "traffic for a new version's first step; steps below it are skipped",
                                  cli_args.integer(1, 99), group="canary steps")
    steps: str = setting("10,50,100", "comma-separated canary percents, rising, ending at 100", _steps,
                         group="canary steps")
    min_samples: int = setting(200, "trajectories per arm (and rewarded ones, for the reward test) before any "
                                    "decision, and canary trajectories per step before moving on", cli_args.integer(1),
                               group="sequential test")
    alpha: float = setting(0.05, "error budget of the whole sequential test (all metrics, arms, steps and looks)",
                           cli_args.number(0, 0.5, lo_open=True, hi_open=True), group="sequential test")
    reward_margin: float = setting(0.05, "non-inferiority margin on the mean reward (absolute, rewards in [0, 1])",
                                   cli_args.number(0, 1, hi_open=True), group="sequential test")
    error_margin: float = setting(0.05, "tolerated increase of the tool/parse error rate (absolute)",
                                  cli_args.number(0, 1, hi_open=True), group="sequential test")
    latency_ratio: float = setting(1.5, "the canary is 'much slower' above this multiple of the stable mean latency",
                                   cli_args.number(1), group="sequential test")
    latency_cap_s: float = setting(120.0, "latencies are clipped here and divided by it (the loop's max_time_s)",
                                   cli_args.number(0, lo_open=True), group="sequential test")
    reward_source: str = setting("any", "which reward is compared: rule, judge, feedback (= human), vote or any "
                                        "(each record's most trusted one: rule, human, vote, judge)",
                                 cli_args.names(REWARD_SOURCES, one=True), group="sequential test")
    traffic_ground_truth: bool = setting(False, "the queries canaries see carry a ground truth (a labelled stream, "
                                                "the demo's environment), so the rule reward exists on them; false "
                                                "(production): reward_source rule is refused at start, since no "
                                                "canary could ever be rewarded", group="sequential test")
    tripwire_min_samples: int = setting(100, "trajectories per arm before a tripwire can fire (judge_rule_"
                                             "disagreement: trajectories with both rewards); 0 turns the tripwires "
                                             "off", cli_args.integer(0), group="tripwires")
    tripwire_tool_error_rate: float = setting(0.15, "tripwire: the canary's share of failed tool calls may exceed "
                                                    "the stable's by this much", _SHARE, group="tripwires")
    tripwire_invalid_call_rate: float = setting(0.10, "tripwire: the canary's share of planner decisions that do not "
                                                      "parse or name no known tool may exceed the stable's by this "
                                                      "much", _SHARE, group="tripwires")
    tripwire_refusal_rate: float = setting(0.10, "tripwire: the canary's share of answers that ask a clarifying "
                                                 "question or refuse may exceed the stable's by this much", _SHARE,
                                           group="tripwires")
    tripwire_answer_length: float = setting(2.0, "tripwire: the canary's mean answer length (words + 1) may be at "
                                                 "most this multiple of the stable's, and at least its inverse",
                                            cli_args.number(1, lo_open=True), group="tripwires")
    tripwire_judge_rule_disagreement: float = setting(0.15, "tripwire: where a record has a judge and a rule reward, "
                                                            "the canary's share of disagreements may exceed the "
                                                            "stable's by this much", _SHARE, group="tripwires")
    tripwire_answer_divergence: float = setting(0.25, "tripwire: the total variation distance between the arms' "
                                                      "distributions of answer shapes (empty, non-answer, length in "
                                                      "words on a log2 scale) may be at most this", _SHARE,
                                                group="tripwires")
    timeout_s: float = setting(21600.0, "a step that reaches no decision in this many seconds takes timeout_action",
                               cli_args.number(0, lo_open=True), group="canary steps")
    timeout_action: str = setting("rollback", "rollback or promote, on timeout",
                                  cli_args.names(("rollback", "promote"), one=True), group="canary steps")
    supersede_s: float = setting(0.0, "a canary still undecided this many seconds into its step is rolled back for "
                                      "a newer version waiting behind it (continuous training: the newest version "
                                      "gets the traffic and the ratings); 0: never, it runs to timeout_s",
                                 cli_args.number(0), group="canary steps")
    supersede_min_rewarded: int = setting(0, "and only once the canary has this many rewarded trajectories: on a "
                                             "loaded machine, or with sparse ratings, it keeps its slot until it had "
                                             "the evidence a decision takes, instead of each newer version starting "
                                             "over from none", cli_args.integer(0), group="canary steps")
    load_timeout_s: float = setting(900.0, "a canary that is not ready this long after loading is rolled back",
                                    cli_args.number(0, lo_open=True), group="canary steps")
    drain_s: float = setting(150.0, "a withdrawn version (the old stable after a promotion, a rolled-back canary) "
                                    "stays routed with weight 0 this long, so that the trajectories on it finish on "
                                    "it; then it is retired (longer than a query's max time)", cli_args.number(0),
                             group="routing")
    tick_s: float = setting(5.0, "how often timeouts and the backend's health are checked",
                            cli_args.number(0, lo_open=True), group="controller and metrics")
    routing_ttl_s: float = setting(600.0, "a routing table expires this long after it was published, and the "
                                          "controller renews it every third of that: callers whose table expired "
                                          "(the controller is gone) send everything to the stable version; 0: never",
                                   cli_args.number(0), group="routing")
    request_timeout_s: float = setting(10.0, "per HTTP / Kubernetes API call", cli_args.number(0, lo_open=True),
                                       group="controller and metrics")
    retries: int = setting(4, "extra attempts on 5xx, 429, conflicts and connection errors (doubling backoff)",
                           cli_args.integer(0), group="controller and metrics")
    recover_s: float = setting(2.0, "at start, read rollout.decisions for this long (settling) to resume a canary",
                               cli_args.number(0), group="controller and metrics")
    metrics_port: int = setting(0, "serve Prometheus /metrics on this port (0: any free port, printed in the ready "
                                   "line; -1: off)", cli_args.port(off=True), group="controller and metrics")
    metrics_host: str = setting("127.0.0.1", "bind address for /metrics (0.0.0.0 in a pod)", cli_args.text(),
                                group="controller and metrics")

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_BACKEND must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "kserve" and not self.inference_service:
            raise InvalidInput("the kserve backend needs AGENTFLOW_ROLLOUT_INFERENCE_SERVICE (--isvc)")
        if self.backend in ("local", "separate", "lora") and not self.llm_url:
            raise InvalidInput(f"the {self.backend} backend needs AGENTFLOW_ROLLOUT_LLM_URL (--llm-admin-url)")
        if self.kserve_mode not in KSERVE_MODES:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_KSERVE_MODE must be one of {', '.join(KSERVE_MODES)}, got "
                               f"{self.kserve_mode!r}")
        if self.fleet_url and self.fleet_type not in FLEET_KINDS:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_FLEET_KIND must be one of {', '.join(FLEET_KINDS)}, got "
                               f"{self.fleet_kind!r}")
        if self.fleet_mirror and (self.fleet_type != "vllm" or not os.path.isabs(self.fleet_mirror)):
            raise InvalidInput("AGENTFLOW_ROLLOUT_FLEET_MIRROR is for the vllm fleet and must be an absolute path, "
                               f"got {self.fleet_mirror!r} with fleet kind {self.fleet_type!r}")
        if not 1 <= self.fleet_slots <= MAX_ROUTES:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_FLEET_SLOTS must be in [1, {MAX_ROUTES}], got {self.fleet_slots}")
        if not self.deployment:
            raise InvalidInput("AGENTFLOW_ROLLOUT_DEPLOYMENT must name the routing table's deployment")
        if self.reward_source not in REWARD_SOURCES:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_REWARD_SOURCE must be one of {', '.join(REWARD_SOURCES)}, "
                               f"got {self.reward_source!r}")
        if self.reward_source == "rule" and not self.traffic_ground_truth:
            raise InvalidInput("AGENTFLOW_ROLLOUT_REWARD_SOURCE=rule compares the ground-truth reward, and "
                               "AGENTFLOW_ROLLOUT_TRAFFIC_GROUND_TRUTH=false says the traffic has none: no canary "
                               "could be rewarded, and each would roll back on its timeout. Compare feedback, judge "
                               "or any (docs/rewards.md, \"Canaries on production rewards\"), or set "
                               "traffic_ground_truth where the queries carry answers")
        if self.timeout_action not in ("rollback", "promote"):
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_TIMEOUT_ACTION must be rollback or promote, got "
                               f"{self.timeout_action!r}")
        checks = [
            (1 <= self.canary_percent <= 99, f"AGENTFLOW_ROLLOUT_CANARY_PERCENT must be in [1, 99], got "
                                             f"{self.canary_percent}"),
            (self.min_samples >= 1, f"AGENTFLOW_ROLLOUT_MIN_SAMPLES must be at least 1, got {self.min_samples}"),
            (0 < self.alpha < 0.5, f"AGENTFLOW_ROLLOUT_ALPHA must be in (0, 0.5), got {self.alpha}"),
            (0 <= self.reward_margin < 1, f"AGENTFLOW_ROLLOUT_REWARD_MARGIN must be in [0, 1), got "
                                          f"{self.reward_margin}"),
            (0 <= self.error_margin < 1, f"AGENTFLOW_ROLLOUT_ERROR_MARGIN must be in [0, 1), got {self.error_margin}"),
            (self.latency_ratio >= 1, f"AGENTFLOW_ROLLOUT_LATENCY_RATIO must be at least 1, got {self.latency_ratio}"),
            (self.latency_cap_s > 0, f"AGENTFLOW_ROLLOUT_LATENCY_CAP_S must be positive, got {self.latency_cap_s}"),
            (self.timeout_s > 0 and self.load_timeout_s > 0 and self.tick_s > 0 and self.request_timeout_s > 0,
             "timeout_s, load_timeout_s, tick_s and request_timeout_s must be positive"),
            (self.drain_s >= 0, f"AGENTFLOW_ROLLOUT_DRAIN_S must be at least 0, got {self.drain_s}"),
            (self.routing_ttl_s == 0 or self.routing_ttl_s >= 3 * self.tick_s,
             f"AGENTFLOW_ROLLOUT_ROUTING_TTL_S must be 0 (never) or at least three ticks ({3 * self.tick_s:g} s), "
             f"got {self.routing_ttl_s}"),
            (self.supersede_s >= 0, f"AGENTFLOW_ROLLOUT_SUPERSEDE_S must be at least 0, got {self.supersede_s}"),
            (self.supersede_min_rewarded >= 0, "AGENTFLOW_ROLLOUT_SUPERSEDE_MIN_REWARDED must be at least 0, got "
                                               f"{self.supersede_min_rewarded}"),
            (self.retries >= 0, f"AGENTFLOW_ROLLOUT_RETRIES must be at least 0, got {self.retries}"),
            (self.recover_s >= 0, f"AGENTFLOW_ROLLOUT_RECOVER_S must be at least 0, got {self.recover_s}"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(message)
        self.ladder  # noqa: B018  (validates steps)
        if self.tripwire_min_samples < 0:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_TRIPWIRE_MIN_SAMPLES must be at least 0, got "
                               f"{self.tripwire_min_samples}")
        for name in TRIPWIRES:
            value = getattr(self, f"tripwire_{name}")
            if name == "answer_length" and not value > 1:
                raise InvalidInput(f"AGENTFLOW_ROLLOUT_TRIPWIRE_ANSWER_LENGTH must be above 1 (a ratio), got {value}")
            if name != "answer_length" and not 0 < value <= 1:
                raise InvalidInput(f"AGENTFLOW_ROLLOUT_TRIPWIRE_{name.upper()} must be in (0, 1], got {value}")

    @property
    def ladder(self) -> tuple[int, ...]:
        """The canary percents in order: ``canary_percent``, then the steps above it (the last is 100)."""
        try:
            steps = canary_steps(self.steps)
        except ValueError as e:
            raise InvalidInput(f"AGENTFLOW_ROLLOUT_STEPS {e}, got {self.steps!r}") from None
        return (self.canary_percent, *(s for s in steps if s > self.canary_percent))

    @property
    def callers_url(self) -> str:
        """local, lora: the OpenAI base URL callers use for the served versions."""
        return self.serving_url or self.llm_url.rstrip("/").removesuffix("/v1") + "/v1"

    @property
    def fleet_type(self) -> str:
        return self.fleet_kind or ("lora" if self.backend == "lora" else "local")

    @property
    def tripwires(self) -> TripwireBounds:
        return TripwireBounds(self.tripwire_min_samples,
                              **{name: getattr(self, f"tripwire_{name}") for name in TRIPWIRES})

    def policy(self) -> Policy:
        return Policy(ladder=self.ladder, min_samples=self.min_samples, alpha=self.alpha,
                      reward_margin=self.reward_margin, error_margin=self.error_margin,
                      latency_ratio=self.latency_ratio, latency_cap_s=self.latency_cap_s, timeout_s=self.timeout_s,
                      timeout_action=self.timeout_action, tripwires=self.tripwires)

    def __repr__(self) -> str:  # keep the admin token out of logs
        shown = {f.name: ("***" if f.name.endswith("admin_token") and getattr(self, f.name) else getattr(self, f.name))
                 for f in fields(self)}
        return "RolloutSettings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"
