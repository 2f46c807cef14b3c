"""The rollout controller's process against a real tansu broker: planner.versions and trajectories in,
rollout.decisions and the routing tables on planner.routing out (followed by a routing client), and a restart that
resumes the canary from its published decisions.

The serving side is the fake admin API of tests/unit/rollout_admin_fake.py (it keeps versions and weights, loads
no model): the run against the real `agentflow serve-llm` belongs with that server's admin API.
"""

import time

from agentflow.bus import Publisher, TopicReader, codec, topics
from agentflow.domain.convert import from_dict
from agentflow.llm.openai_engine import OpenAIEngineConfig
from agentflow.llm.routing import Route, RoutedEngine, RoutingTable, routing_key
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.proto.v1 import trajectory_pb2
from agentflow.rollout.service import RolloutService
from agentflow.rollout.settings import RolloutSettings
from tests.unit.rollout_admin_fake import FakeAdmin

READY_S = 20


def trajectory(tid: str, version: str, reward: float) -> pb.Envelope:
    record = {"trajectory_id": tid, "query": "q", "status": "answered", "started_at_unix": time.time() + 1,
              "analysis_call": {"model_version": version},
              "turns": [{"step": 0, "planner": {"model_version": version}}],
              "rewards": [{"value": reward, "source": "rule"}], "totals": {"turns": 1, "latency_s": 2.0}}
    return codec.new_envelope(tid, 0, from_dict(record, trajectory_pb2.Trajectory))


def routes_become(client: RoutedEngine, wanted: dict, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        table = client.table
        if table is not None and {r.version: r.weight for r in table.routes} == wanted:
            return True
        time.sleep(0.1)
    return False


def decisions(reader, count):
    return [(r.envelope().rollout_decision.version, r.envelope().rollout_decision.action)
            for r in reader.read(count, timeout_s=30)]


def test_canary_then_rollback_then_resume_after_restart(bus_config):
    with FakeAdmin() as admin:
        settings = RolloutSettings(backend="local", llm_url=admin.url, min_samples=10, reward_margin=0.2,
                                   tick_s=0.2, recover_s=1.0, drain_s=1.0)
        service = RolloutService(settings, bus_config).start()
        client = RoutedEngine(OpenAIEngineConfig(endpoint=f"{admin.url}/v1"), "planner").follow(bus_config)
        try:
            assert service.worker.wait_ready(READY_S)
            with Publisher(bus_config) as publisher, TopicReader(bus_config, topics.ROLLOUT_DECISIONS) as reader:
                publisher.publish(topics.PLANNER_VERSIONS, codec.new_envelope(
                    "trainer", 1, pb.PlannerVersion(version="v1", checkpoint_uri="file:///ckpt/v1")))
                publisher.flush()
                assert decisions(reader, 1) == [("v1", "canary")]
                assert admin.weights() == {"v0": 90, "v1": 10}
                assert routes_become(client, {"v1": 10, "v0": 90})
                for i in range(40):  # the canary fails every query, stable answers every one
                    publisher.publish(topics.TRAJECTORIES, trajectory(f"c{i}", "v1", 0.0))
                    publisher.publish(topics.TRAJECTORIES, trajectory(f"s{i}", "v0", 1.0))
                publisher.flush()
                assert decisions(reader, 2)[1] == ("v1", "rollback")
                assert client.table.stable == "v0" and routes_become(client, {"v0": 100, "v1": 0})  # draining
                assert routes_become(client, {"v0": 100})  # retired after drain_s
                assert admin.weights() == {"v0": 100}
                in_force, rejected = client.table, client.metrics.tables.labels("rejected")._value.get()
                key = routing_key("planner").encode()  # a foreign writer: garbage, a bad sum, an unknown endpoint
                publisher.send_raw(topics.PLANNER_ROUTING, b"\x00not an envelope", key=key)
                for routes in ([("v0", 60), ("v9", 30)], [("v9", 100)]):
                    bad = RoutingTable("planner", tuple(Route(v, admin.url + "/v1" if v == "v0" else
                                                              "http://attacker.test/v1", v, w) for v, w in routes),
                                       decided_at_unix_ms=codec.now_ms() + 1000)
                    publisher.publish(topics.PLANNER_ROUTING, codec.new_envelope(key.decode(), 0, bad.to_proto()))
                publisher.flush()
                deadline = time.monotonic() + 20
                while client.metrics.tables.labels("rejected")._value.get() < rejected + 3 and \
                        time.monotonic() < deadline:
                    time.sleep(0.1)
                assert client.metrics.tables.labels("rejected")._value.get() == rejected + 3
                assert client.table is in_force

                publisher.publish(topics.PLANNER_VERSIONS, codec.new_envelope(
                    "trainer", 2, pb.PlannerVersion(version="v2", checkpoint_uri="file:///ckpt/v2")))
                publisher.flush()
                assert decisions(reader, 3)[2] == ("v2", "canary")
        finally:
            service.stop()
            client.close()

        restarted = RolloutService(settings, bus_config).start()
        try:
            assert restarted.controller.rollout is not None
            assert restarted.controller.rollout.canary.name == "v2"  # resumed from rollout.decisions
            assert restarted.worker.wait_ready(READY_S)
            with Publisher(bus_config) as publisher:  # the trainer publishes v2 again: nothing happens twice
                publisher.publish(topics.PLANNER_VERSIONS, codec.new_envelope(
                    "trainer", 2, pb.PlannerVersion(version="v2", checkpoint_uri="file:///ckpt/v2")))
                publisher.flush()
            time.sleep(2)
            with TopicReader(bus_config, topics.ROLLOUT_DECISIONS) as reader:
                assert len(reader.read(3, timeout_s=10, settle_s=1.0)) == 3
            assert admin.weights() == {"v0": 90, "v2": 10}
        finally:
            restarted.stop()
