"""Kafka access in the chart (strimzi.users): one KafkaUser per component, ACLs that allow exactly what the code
uses, and pods that authenticate as their own user. What the brokers enforce at run time (that the ACLs refuse a
forged record) needs a Strimzi cluster; here the rendered users and credentials are checked against the code."""

from __future__ import annotations

import pytest

from .conftest import CHART, parse, template

FULLNAME = "agentflow"
COMPONENTS = ("gateway", "memory", "planner", "executor", "verifier", "generator", "trainer", "rollout", "driver", "judge")


def users(docs) -> dict[str, dict]:
    return {d["metadata"]["name"].removeprefix(f"{FULLNAME}-"): d for d in docs if d["kind"] == "KafkaUser"}


def allowed(user: dict, operation: str, kind: str = "topic") -> set[str]:
    return {acl["resource"]["name"] for acl in user["spec"]["authorization"]["acls"]
            if acl["resource"]["type"] == kind and operation in acl["operations"]}


def consumed_topics() -> dict[str, set[str]]:
    """What each component reads, from the code."""
    from agentflow.bus import topics
    from agentflow.services import executor, gateway, generator, memory, planner, verifier
    from agentflow.services.judge import JudgeService

    return {"judge": set(JudgeService.input_topics),
            "gateway": set(gateway.FOLLOWED), "memory": set(memory.MemoryService.input_topics) | {
                topics.MEMORY_CHANGELOG},
            # the planner's LLM client follows the routing table (agentflow/llm/routing.py follow_routing)
            "planner": set(planner.PlannerService.input_topics) | {topics.PLANNER_ROUTING},
            "executor": set(executor.ExecutorService.input_topics),
            "verifier": set(verifier.VerifierService.input_topics),
            "generator": set(generator.GeneratorService.input_topics),
            "trainer": {topics.TRAJECTORIES, topics.PLANNER_VERSIONS},
            "rollout": {topics.PLANNER_VERSIONS, topics.TRAJECTORIES, topics.ROLLOUT_DECISIONS},
            # the rollout driver's --from-traffic follows trajectories (trainer/drive.py follow_traffic), and every
            # driver the trainer's progress (trainer/pace.py follow_progress)
            "driver": {topics.TRAJECTORIES, topics.TRAINER_PROGRESS}}


def produced_topics() -> dict[str, set[str]]:
    from agentflow.bus import topics
    from agentflow.services import executor, generator, planner, verifier

    ring = {s.name: {s.output_topic, topics.DEADLETTER} for s in (planner.PlannerService, executor.ExecutorService,
                                                                    verifier.VerifierService,
                                                                    generator.GeneratorService)}
    return {**ring, "gateway": {topics.QUERIES, topics.FEEDBACK},
            "memory": {topics.MEMORY_UPDATED, topics.FINALIZE, topics.TRAJECTORIES, topics.MEMORY_CHANGELOG,
                       topics.DEADLETTER},
            "trainer": {topics.PLANNER_VERSIONS, topics.TRAINER_PROGRESS},
            "rollout": {topics.ROLLOUT_DECISIONS, topics.PLANNER_ROUTING, topics.DEADLETTER},
            "driver": set(), "judge": {topics.FEEDBACK, topics.DEADLETTER}}


def test_each_component_may_use_exactly_its_topics(render_profile):
    by_component = users(render_profile("gpu").docs)
    assert set(by_component) == set(COMPONENTS)
    read, written = consumed_topics(), produced_topics()
    for name, user in by_component.items():
        assert user["spec"]["authentication"]["type"] == "tls"
        assert allowed(user, "Read") == read[name], name
        assert allowed(user, "Write") == written[name], name
        every = {op for acl in user["spec"]["authorization"]["acls"] for op in acl["operations"]}
        assert every <= {"Read", "Write", "Describe"}, f"{name} may {every}"  # no Create, Alter, Delete, All
        assert all(acl["resource"]["patternType"] == "literal" for acl in user["spec"]["authorization"]["acls"])
    writers = {topic: {n for n, u in by_component.items() if topic in allowed(u, "Write")}
               for topic in ("queries", "trajectories", "plans", "planner.versions", "planner.routing")}
    assert writers == {"queries": {"gateway"}, "trajectories": {"memory"}, "plans": {"planner"},
                       "planner.versions": {"trainer"}, "planner.routing": {"rollout"}}
    assert allowed(by_component["planner"], "Read", "group") == {"planner"}
    assert allowed(by_component["gateway"], "Read", "group") == set()  # it follows the ring outside any group


def test_pods_authenticate_as_their_own_user(render_profile):
    render = render_profile("gpu")
    for name in COMPONENTS:
        kind = "Deployment" if name not in ("trainer",) else None
        objects = [d for d in render.docs if d["kind"] in ("Deployment", "StatefulSet")
                   and d["metadata"]["name"] == f"{FULLNAME}-{name}"]
        assert len(objects) == 1, (name, kind)
        pod = objects[0]["spec"]["template"]["spec"]
        (main,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["AGENTFLOW_KAFKA_TLS_CERTFILE"] == "/etc/agentflow/kafka-user/user.crt"
        assert env["AGENTFLOW_KAFKA_TLS_KEYFILE"] == "/etc/agentflow/kafka-user/user.key"
        (volume,) = [v for v in pod["volumes"] if v["name"] == "kafka-user"]
        assert volume["secret"]["secretName"] == f"{FULLNAME}-{name}"
        assert any(m["name"] == "kafka-user" for m in main["volumeMounts"])


def test_scram_users_over_sasl(helm, tmp_path):
    values = tmp_path / "sasl.yaml"
    values.write_text("kafka:\n  securityProtocol: SASL_SSL\n")
    docs = parse(template(helm, [CHART / "values-gpu.yaml", values]).stdout)
    assert {u["spec"]["authentication"]["type"] for u in users(docs).values()} == {"scram-sha-512"}
    planner = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{FULLNAME}-planner")
    env = {e["name"]: e for e in planner["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["AGENTFLOW_KAFKA_SASL_USERNAME"]["value"] == f"{FULLNAME}-planner"
    assert env["AGENTFLOW_KAFKA_SASL_MECHANISM"]["value"] == "SCRAM-SHA-512"
    assert env["AGENTFLOW_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-planner",
                                                                                   "key": "password"}


@pytest.mark.parametrize("values, users_expected", [("strimzi:\n  enabled: true\n", None),
                                                    ("strimzi:\n  enabled: true\n  users:\n    enabled: false\n", 0),
                                                    ("{}\n", 0)])
def test_users_need_an_authenticating_listener(helm, tmp_path, values, users_expected):
    path = tmp_path / "v.yaml"
    path.write_text(values)
    result = template(helm, [path], check=False)
    if users_expected is None:
        assert result.returncode != 0 and "strimzi.users needs an authenticating listener" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert len(users(parse(result.stdout))) == users_expected
