"""The service ring against the in-process loop, on the same LLM server; prints JSON (last line: the summary).

  .venv/bin/python bench/ring.py [--model tiny|scripted|smollm2|DIR] [--queries 20] [--concurrency 1]
                                 [--max-steps 3] [--runs 3] [--replicas 1,2] [--throughput-concurrency 8]

One LLM server serves both sides. First the in-process loop (``build_agent`` over an ``OpenAIEngine`` on that server,
the default tools, ``--max-steps``) answers ``--queries`` queries per run, ``--concurrency`` at a time, while nothing
else runs; then what `agentflow up` starts (tansu and six service processes, on the same server) answers the same
queries through the gateway's Solve. (Idle ring services poll Kafka and take CPU, so they are not up during the
in-process runs.) Per run, for both:

* **step latency** (ms, p50/p99 over all steps): in-process, the turn's ``total_s``; through the ring, from the
  ``memory.updated`` event of step t to the memory's next event (``memory.updated`` t+1 or ``finalize``), less the
  query analysis the planner makes at step 0 (the loop does it before its first step);
* **step overhead** (ms): step latency less the stages' own compute (plan + execute + verify, as the events and
  turn timings report them): what the ring (four hops, memory bookkeeping, (de)serialisation) or the loop adds;
* **query latency** (ms, p50/p99): the caller's wall time for one query;
* **per-hop bus overhead** (ring only, ms): ``produced_at`` of a stage's output minus ``produced_at`` of its input
  minus the stage's own compute, per hop (gateway→memory, memory→planner, planner→executor, executor→verifier,
  verifier→memory, memory→generator, generator→memory) and pooled over the four hops of a step.

Reported: each run's numbers, then the medians over ``--runs`` runs and the ratios ring / in-process. Then completed
trajectories per second at ``--throughput-concurrency`` with 1 and 2 replicas of every service (``--replicas``), and
the in-process loop's at the same concurrency.

The summary also carries ``overhead_p50_ms`` (the ring's median step overhead), ``target_ms`` (25, issue 3) and
``met``; the load averages (``uptime``) at the start, per run and at the end, since the machine is shared; and
``idle_ring_cpu_pct``: the CPU the idle ring (tansu and the six services, between warm-up and the first run) takes
over ``--idle-cpu-s`` seconds, in percent of one core, per process and in total.

``--model tiny`` (default) is a random ~1M-parameter model built with ``build_tiny``: its plans do not parse, so a
step is the planner's call and the executor and verifier pass it through. ``--model scripted`` serves a zero-latency
scripted engine (plan ``search``, command, CONTINUE, answer) over the same HTTP server, which isolates the overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agentflow.children import stop_group
from _proc import cpu_seconds, start_announcing  # bench/_proc.py: this script's folder is on sys.path

TARGET_OVERHEAD_MS = 25  # issue 3: ring step overhead p50 with a zero-latency engine
HOPS = ("gateway>memory", "memory>planner", "planner>executor", "executor>verifier", "verifier>memory",
        "memory>generator", "generator>memory")
STEP_HOPS = HOPS[1:5]
FOLLOWED = ("queries", "memory.updated", "plans", "executions", "verdicts", "finalize", "answers", "trajectories")
QUESTIONS = ["What is {a} + {b}?", "Which number is larger, {a} or {b}?", "What is {a} times {b}?",
             "What is the capital of Veloria? (ask {a})", "Name a prime between {a} and {b}."]


def queries(n: int, salt: str) -> list[str]:
    return [QUESTIONS[i % len(QUESTIONS)].format(a=17 + i, b=25 + 3 * i) + f" [{salt}-{i}]" for i in range(n)]


# --- the zero-latency scripted LLM server (--model scripted) ---------------------------------------------------------
SCRIPT = {  # prompt marker (agentflow/prompts/*.md) -> reply
    "Analyse the question": "Look it up with search.",
    "Choose the next step": "Context: none\nSub-Goal: find the relevant passage\nTool Name: search",
    "Write the input": "capital of Veloria",
    "Is this enough": "Analysis: not yet\nConclusion: CONTINUE",
    "Answer the question": "The passage says so.\nAnswer: 42",
}


def scripted_reply(messages) -> str:
    prompt = messages[-1]["content"]
    return next((reply for marker, reply in SCRIPT.items() if marker in prompt), "Answer: 42")


def serve_scripted() -> None:
    """``--serve-scripted``: the scripted engine behind the project's OpenAI-compatible server, until killed."""
    from agentflow.llm.scripted import ScriptedEngine
    from agentflow.llm.server import make_server

    engine = ScriptedEngine(scripted_reply)
    engine.calls = _Discard()  # it would keep every prompt otherwise
    server = make_server(engine, "agentflow", "scripted")
    print(json.dumps({"service": "llm", "url": f"http://127.0.0.1:{server.server_address[1]}/v1"}), flush=True)
    server.serve_forever()


class _Discard(list):
    def append(self, _item) -> None:
        pass


def start_llm(model: str, work: Path) -> tuple[str, subprocess.Popen]:
    """The LLM server both sides use: (its /v1 URL, its process). ``serve-llm`` for a model, else the scripted one."""
    if model == "scripted":
        command = [sys.executable, __file__, "--serve-scripted"]
    else:
        folder = model
        if model == "tiny":
            from agentflow.llm.models import build_tiny

            folder = str(work / "tiny")
            if not (Path(folder) / "config.json").exists():
                build_tiny(folder, seed=0)
        command = [sys.executable, "-m", "agentflow.cli", "serve-llm", "--model", folder]
    with open(work / "llm.log", "ab") as log:
        process, ready = start_announcing(command, log)
    return ready["url"], process


def idle_cpu(pids: dict[str, int], seconds: float) -> dict | None:
    """CPU % of one core each process takes over ``seconds`` while nothing is asked of it, and the total."""
    if seconds <= 0:
        return None
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
    per = {name: _r(100 * (after[name] - before[name]) / wall, 1) for name in pids
           if before[name] is not None and after[name] is not None}
    return {"seconds": _r(wall, 1), "total": _r(sum(per.values()), 1), "per_process": per,
            "loadavg": _load()}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# --- statistics ------------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) with linear interpolation; None for no data."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summary(values: list[float]) -> dict:
    return {"p50": _r(pct(values, 0.5)), "p99": _r(pct(values, 0.99)), "n": len(values)}


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def median_of(runs: list[dict], *path: str) -> float | None:
    values = []
    for run in runs:
        v = run
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        if v is not None:
            values.append(v)
    return _r(statistics.median(values)) if values else None


# --- the ring --------------------------------------------------------------------------------------------------------
class EventLog:
    """Every event of the followed topics, read from the beginning and kept up to date between runs."""

    def __init__(self, bootstrap: str):
        from agentflow.bus.clients import TopicReader
        from agentflow.bus.config import BusConfig

        config = BusConfig(bootstrap_servers=bootstrap)
        self.readers = {t: TopicReader(config, t) for t in FOLLOWED}
        self.by_tid: dict[str, dict[tuple[str, int], object]] = {}  # tid -> (topic, step) -> first envelope

    def catch_up(self, tids: set[str], timeout_s: float = 30.0) -> None:
        """Read until every trajectory in ``tids`` has its record on ``trajectories``, then until quiet."""
        deadline = time.monotonic() + timeout_s
        while True:
            fresh = 0
            for topic, reader in self.readers.items():
                for record in reader.poll(0.05):
                    fresh += 1
                    envelope = record.envelope()
                    events = self.by_tid.setdefault(envelope.trajectory_id, {})
                    events.setdefault((topic, envelope.step), envelope)  # at-least-once: the first copy counts
            done = all(any(t == "trajectories" for t, _ in self.by_tid.get(tid, {})) for tid in tids)
            if (done and not fresh) or time.monotonic() > deadline:
                return

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


def ring_timings(events: dict) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """(step latencies ms, step overheads ms, per-hop overheads ms) of one trajectory from its events."""
    def at(topic, step):
        e = events.get((topic, step))
        return None if e is None else e.produced_at_unix_ms

    steps, overheads, hops = [], [], {h: [] for h in HOPS}
    query, mem0 = at("queries", 0), at("memory.updated", 0)
    if query is not None and mem0 is not None:
        hops["gateway>memory"].append(mem0 - query)
    t = 0
    while ("memory.updated", t) in events and ("verdicts", t) in events:
        plan, execution, verdict = events[("plans", t)].plan, events[("executions", t)].execution, \
            events[("verdicts", t)].verdict
        nxt = at("memory.updated", t + 1) or at("finalize", t + 1)
        if nxt is None:
            break
        analysis_ms = plan.analysis_call.latency_s * 1000 if plan.HasField("analysis_call") else 0.0
        timings = (plan.turn.timings.plan_s, execution.turn.timings.execute_s, verdict.turn.timings.verify_s)
        plan_ms, exec_ms, verify_ms = (seconds * 1000 for seconds in timings)
        mem, p, x, v = at("memory.updated", t), at("plans", t), at("executions", t), at("verdicts", t)
        hops["memory>planner"].append(p - mem - plan_ms - analysis_ms)
        hops["planner>executor"].append(x - p - exec_ms)
        hops["executor>verifier"].append(v - x - verify_ms)
        hops["verifier>memory"].append(nxt - v)
        step_ms = nxt - mem - analysis_ms
        steps.append(step_ms)
        overheads.append(step_ms - plan_ms - exec_ms - verify_ms)
        t += 1
    finalize, answer, record = at("finalize", t), events.get(("answers", t)), at("trajectories", t)
    if finalize is not None and answer is not None:
        hops["memory>generator"].append(answer.produced_at_unix_ms - finalize - answer.answer.duration_s * 1000)
        if record is not None:
            hops["generator>memory"].append(record - answer.produced_at_unix_ms)
    return steps, overheads, hops


def add_replicas(cluster, names, number: int, timeout_s: float = 120.0) -> list[str]:
    """Replica ``number`` of each service (same arguments); returns the gateways' endpoints."""
    for name in names:
        replica = cluster.spawn(f"{name}-{number}", cluster.child(name).args, timeout_s)
        cluster.wait_serving(replica, timeout_s)
    return [f"127.0.0.1:{c.info['grpc_port']}" for c in cluster.children if c.name.startswith("gateway")]


def ring_batch(gateways: list[str], texts: list[str], concurrency: int,
               max_steps: int) -> tuple[list, list[float], float]:
    """Solve every text through the gateways (round robin); (responses, latencies ms, wall s)."""
    import grpc

    from agentflow.proto.v1 import events_pb2, gateway_pb2, gateway_pb2_grpc

    channels = [grpc.insecure_channel(g) for g in gateways]
    stubs = [gateway_pb2_grpc.AgentFlowStub(ch) for ch in channels]
    options = events_pb2.QueryOptions(max_steps=max_steps)

    def ask(i: int):
        started = time.perf_counter()
        response = stubs[i % len(stubs)].Solve(gateway_pb2.SolveRequest(query=texts[i], options=options), timeout=600)
        return response, (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(ask, range(len(texts))))
    wall = time.perf_counter() - started
    for ch in channels:
        ch.close()
    return [r for r, _ in results], [ms for _, ms in results], wall


def ring_run(gateways, log: EventLog, texts, concurrency, max_steps) -> dict:
    responses, latencies, wall = ring_batch(gateways, texts, concurrency, max_steps)
    tids = {r.trajectory_id for r in responses}
    log.catch_up(tids)
    steps, overheads, hops = [], [], {h: [] for h in HOPS}
    for tid in tids:
        s, o, h = ring_timings(log.by_tid.get(tid, {}))
        steps += s
        overheads += o
        for k, v in h.items():
            hops[k] += v
    pooled = [x for h in STEP_HOPS for x in hops[h]]
    return {"step_ms": summary(steps), "step_overhead_ms": summary(overheads), "query_ms": summary(latencies),
            "trajectories_per_s": _r(len(texts) / wall), "statuses": _count(r.status for r in responses),
            "hop_overhead_ms": {"per_step_hop": summary(pooled), **{h: summary(v) for h, v in hops.items()}}}


# --- the in-process loop --------------------------------------------------------------------------------------------
def build_inprocess(llm_url: str, max_steps: int):
    from agentflow.config import EngineSettings
    from agentflow.flow.build import build_agent
    from agentflow.flow.loop import LoopConfig
    from agentflow.llm import build_engine
    from agentflow.tools.registry import DEFAULT_TOOLS

    settings = EngineSettings(engine="openai", endpoint=llm_url)  # what the services build from --endpoint
    engine = build_engine(settings)
    return build_agent(engine, list(DEFAULT_TOOLS), LoopConfig(max_steps=max_steps), call_timeout_s=settings.timeout_s)


def inprocess_batch(agent, texts, concurrency) -> tuple[list[dict], list[float], float]:
    def solve(text):
        started = time.perf_counter()
        record = agent.solve(text)
        return record, (time.perf_counter() - started) * 1000

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(solve, texts))
    return [r for r, _ in results], [ms for _, ms in results], time.perf_counter() - started


def inprocess_run(agent, texts, concurrency) -> dict:
    records, latencies, wall = inprocess_batch(agent, texts, concurrency)
    steps, overheads = [], []
    for record in records:
        for turn in record["turns"]:
            t = turn["timings"]
            steps.append(t["total_s"] * 1000)
            overheads.append((t["total_s"] - t["plan_s"] - t["execute_s"] - t["verify_s"]) * 1000)
    return {"step_ms": summary(steps), "step_overhead_ms": summary(overheads), "query_ms": summary(latencies),
            "trajectories_per_s": _r(len(texts) / wall), "statuses": _count(r["status"] for r in records)}


def _count(items) -> dict:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


# --- main ------------------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (default), scripted, smollm2, or a model folder")
    parser.add_argument("--queries", type=int, default=20, help="queries per run")
    parser.add_argument("--concurrency", type=int, default=1, help="queries in flight at once (latency runs)")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--replicas", default="1,2", help="replicas per service for the throughput runs ('' skips)")
    parser.add_argument("--throughput-concurrency", type=int, default=8)
    parser.add_argument("--idle-cpu-s", type=float, default=10.0,
                        help="measure the idle ring's CPU for this long before the runs (0 skips)")
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "agentflow-bench-ring"))
    parser.add_argument("--serve-scripted", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_scripted:
        return serve_scripted()

    from agentflow.services.cluster import START_ORDER, start_cluster

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the finally clauses stop every process
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
    warm = queries(max(2, args.concurrency), "warm-up")  # connections, tool indexes, the model's first batches
    throughput: dict[str, float | None] = {}
    ring_runs, inproc_runs = [], []
    load_at_start = _load()  # the machine is shared: say how busy it was
    idle = None
    llm_url, llm = start_llm(args.model, work)
    try:
        # The in-process loop first, while only the LLM server runs: idle ring services poll and would take CPU.
        agent = build_inprocess(llm_url, args.max_steps)
        inprocess_batch(agent, warm, args.concurrency)
        for r in range(args.runs):
            inproc_runs.append(inprocess_run(agent, queries(args.queries, f"run{r}"), args.concurrency))
            inproc_runs[-1]["loadavg"] = _load()
            print(json.dumps({"run": r, "inprocess": inproc_runs[-1]}), flush=True)
        if replicas:
            _, _, wall = inprocess_batch(agent, queries(args.queries, "tput-inproc"), args.throughput_concurrency)
            throughput["inprocess"] = _r(args.queries / wall)

        env = {"AGENTFLOW_LOOP_MAX_STEPS": str(args.max_steps), "AGENTFLOW_RPC_MAX_WORKERS": "64"}
        started = time.perf_counter()
        cluster = start_cluster(log_dir=work / "logs", llm_url=llm_url, env=env, progress=lambda *_: None)
        up_s = time.perf_counter() - started
        try:
            log = EventLog(cluster.bootstrap)
            gateways = [cluster.endpoint("gateway")]
            ring_batch(gateways, warm, args.concurrency, args.max_steps)
            pids = {c.name: c.process.pid for c in cluster.children}
            if cluster.broker is not None:
                pids["tansu"] = cluster.broker.process.pid
            idle = idle_cpu(pids, args.idle_cpu_s)
            if idle is not None:
                print(json.dumps({"idle_ring_cpu_pct": idle}), flush=True)
            for r in range(args.runs):
                ring_runs.append(ring_run(gateways, log, queries(args.queries, f"run{r}"), args.concurrency,
                                          args.max_steps))
                ring_runs[-1]["loadavg"] = _load()
                print(json.dumps({"run": r, "ring": ring_runs[-1]}), flush=True)
            for n in sorted(replicas):
                while len(gateways) < n:
                    gateways = add_replicas(cluster, START_ORDER, len(gateways) + 1)
                ring_batch(gateways, queries(args.throughput_concurrency, f"warm{n}"), args.throughput_concurrency,
                           args.max_steps)
                _, _, wall = ring_batch(gateways, queries(args.queries, f"tput{n}"), args.throughput_concurrency,
                                        args.max_steps)
                throughput[f"ring_{n}x"] = _r(args.queries / wall)
                print(json.dumps({"throughput": {f"ring_{n}x": throughput[f"ring_{n}x"]}}), flush=True)
            log.close()
        finally:
            cluster.stop()
    finally:
        stop_group(llm)
    runs = [{"ring": a, "inprocess": b} for a, b in zip(ring_runs, inproc_runs)]

    def side(name: str) -> dict:
        return {"step_ms": {q: median_of(runs, name, "step_ms", q) for q in ("p50", "p99")},
                "step_overhead_ms": {q: median_of(runs, name, "step_overhead_ms", q) for q in ("p50", "p99")},
                "query_ms": {q: median_of(runs, name, "query_ms", q) for q in ("p50", "p99")},
                "trajectories_per_s": median_of(runs, name, "trajectories_per_s")}

    ring, inproc = side("ring"), side("inprocess")
    ring["hop_overhead_ms"] = {h: {q: median_of(runs, "ring", "hop_overhead_ms", h, q) for q in ("p50", "p99")}
                               for h in ("per_step_hop",) + HOPS}

    def ratio(a, b):
        return _r(a / b, 3) if a is not None and b else None

    from agentflow.bus.config import BusConfig

    bus = BusConfig.from_env()  # what the services were started with
    overhead = ring["step_overhead_ms"]["p50"]
    print(json.dumps({
        "bench": "ring", "model": args.model, "queries": args.queries, "concurrency": args.concurrency,
        "max_steps": args.max_steps, "runs": args.runs, "cpus": os.cpu_count(),
        "overhead_p50_ms": overhead, "target_ms": TARGET_OVERHEAD_MS,
        "met": overhead is not None and overhead < TARGET_OVERHEAD_MS,
        "bus": {"fetch_max_wait_ms": bus.fetch_max_wait_ms, "fetch_min_bytes": bus.fetch_min_bytes,
                "linger_ms": bus.linger_ms, "client_metrics": bus.client_metrics},
        "loadavg_at_start": load_at_start, "loadavg_per_run": [r.get("loadavg") for r in ring_runs],
        "loadavg_at_end": _load(), "idle_ring_cpu_pct": idle,
        "cluster_up_s": _r(up_s),
        "ring": ring, "inprocess": inproc,
        "ratio_ring_vs_inprocess": {
            "step_p50": ratio(ring["step_ms"]["p50"], inproc["step_ms"]["p50"]),
            "step_p99": ratio(ring["step_ms"]["p99"], inproc["step_ms"]["p99"]),
            "query_p50": ratio(ring["query_ms"]["p50"], inproc["query_ms"]["p50"]),
            "query_p99": ratio(ring["query_ms"]["p99"], inproc["query_ms"]["p99"])},
        "ring_extra_per_step_ms_p50": _r(ring["step_ms"]["p50"] - inproc["step_ms"]["p50"])
        if ring["step_ms"]["p50"] is not None and inproc["step_ms"]["p50"] is not None else None,
        "throughput_trajectories_per_s": {**throughput, "concurrency": args.throughput_concurrency} if throughput
        else None,
        "statuses": {"ring": runs[-1]["ring"]["statuses"], "inprocess": runs[-1]["inprocess"]["statuses"]},
    }), flush=True)


if __name__ == "__main__":
    main()
