"""The production traffic of `agentflow demo`, and (--unlabeled) the simulated users who rate its answers."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from agentflow.demo.settings import MAX_STEPS, TRAFFIC_TEMPERATURE, USERS, DemoSettings
from agentflow.demo.shared import Shared, pct

# Production queries at once; beyond that the sender waits. The driver's training concurrency, and more than 5
# queries a second keep in flight on idle cores (about 5, p50 0.9 s): on a loaded machine the ring slows, and a
# larger cap let production take most of it, so training (and the run) slowed far more than the machine did.
IN_FLIGHT = 12


class Traffic:
    """Sends ``production`` queries (``Item``s) through ``gateway`` and counts their answers into ``shared``;
    the texts in ``private`` opt out of training."""

    def __init__(self, settings: DemoSettings, shared: Shared, gateway, production: list, private: set[str],
                 stop: threading.Event):
        self.settings, self.shared, self.gateway, self.stop = settings, shared, gateway, stop
        self.production, self.private = production, private
        self.users = random.Random(settings.seed + 2)  # the simulated users' ratings (under the lock)
        self.latencies: list[float] = []  # these two under the lock too
        self.step_latencies: list[float] = []

    def run(self) -> None:
        """Production queries at ``traffic_qps``, at most IN_FLIGHT at once, until ``stop``."""
        rng = random.Random(self.settings.seed)
        slots = threading.Semaphore(IN_FLIGHT)
        pool = ThreadPoolExecutor(IN_FLIGHT)
        next_at = time.monotonic()
        while not self.stop.is_set():
            if not slots.acquire(timeout=0.5):
                continue
            item = rng.choice(self.production)
            pool.submit(self._one_query, item).add_done_callback(lambda _: slots.release())
            with self.shared as state:
                state["traffic"]["sent"] += 1
            next_at = max(next_at + 1.0 / self.settings.traffic_qps, time.monotonic() - 1.0)
            self.stop.wait(max(0.0, next_at - time.monotonic()))
        pool.shutdown(wait=True)  # the queries in flight finish (and count) before the ring stops

    def _one_query(self, item) -> None:
        t0 = time.monotonic()
        response = self._solve(item)
        latency = time.monotonic() - t0
        with self.shared as state:
            if response is None:
                state["traffic"]["failed"] += 1
                return
            correct = self._count_answer(state, item, response, latency)
            user_rating = rating(self.users, self.settings, correct) if self.settings.unlabeled else None
        if user_rating is not None:
            self._send_rating(response.trajectory_id, *user_rating, correct)

    def _solve(self, item):
        """The gateway's response to a production query; None when it failed."""
        import grpc

        unlabeled = self.settings.unlabeled
        try:
            response = self.gateway.solve(item.query, answer="" if unlabeled else item.answer, source="traffic",
                                          max_steps=MAX_STEPS, max_time_s=60,
                                          temperature=TRAFFIC_TEMPERATURE if unlabeled else None,
                                          train_ok=False if item.query in self.private else None)
        except grpc.RpcError:
            return None
        return None if response.status == "error" else response

    def _count_answer(self, state: dict, item, response, latency: float) -> bool:
        """An answer into the traffic counters, its version's tally and the examples (under the lock); whether it
        was right."""
        from agentflow.domain.convert import record_from_proto
        from agentflow.domain.trajectory import Record
        from agentflow.rewards import score

        traffic = state["traffic"]
        traffic["answered"] += 1
        self.latencies.append(latency)
        record = record_from_proto(response.trajectory)
        turns = record.get("turns", [])
        for turn in turns:
            self.step_latencies.append(turn.get("timings", {}).get("total_s", 0.0))
        view = Record(record)
        traffic["mixed"] += len(view.planner_versions()) > 1  # routing by trajectory: never
        version = next((t["planner"].get("model_version", "") for t in turns if t.get("planner")), "")
        correct = score("math", record.get("answer", ""), {"answer": item.answer})["value"] >= 1
        mine = traffic["by_version"].setdefault(version or "?", {"answered": 0, "correct": 0})
        mine["answered"] += 1
        mine["correct"] += correct
        example = {"query": item.query, "answer": record.get("answer", ""), "expected": item.answer,
                   "correct": correct, "trace_id": record.get("trace_id", ""),
                   "trajectory_id": record.get("trajectory_id", ""), "version": version, "tools": view.tools()}
        state["examples"] = (state["examples"] + [example])[-12:]
        elapsed = max(time.monotonic() - self.shared.started, 1e-9)
        traffic.update(qps=round(traffic["answered"] / elapsed, 2), latency_p50_s=pct(self.latencies, 50),
                       latency_p95_s=pct(self.latencies, 95), step_latency_p50_s=pct(self.step_latencies, 50))
        return correct

    def _send_rating(self, tid: str, value: float, user: str, correct: bool) -> None:
        import grpc

        try:
            self.gateway.feedback(tid, value, labeller=user)  # the gateway counts each user as a rater (delegate)
            ok = True
        except grpc.RpcError:
            ok = False
        with self.shared as state:
            feedback = state["feedback"]
            feedback["sent" if ok else "failed"] += 1
            feedback["wrong"] += ok and (value >= 1) != correct


def rating(users: random.Random, settings: DemoSettings, correct: bool) -> tuple[float, str] | None:
    """A simulated user's rating and name, drawn from ``users``: None when nobody rates. One of ``USERS`` people
    rates; an honest one is wrong with the noise, a hostile one (the first ``hostile_raters`` of them) always."""
    if users.random() >= settings.rated_share:
        return None
    user = users.randrange(USERS)
    wrong = user < settings.hostile_raters * USERS or users.random() < settings.rating_noise
    return float(correct != wrong), f"user-{user:03d}"
