"""How many CPUs this process may use, and the OpenMP thread count that follows from it.

torch starts one OpenMP thread per CPU in the affinity mask; a container's CPU quota (cgroup v2 ``cpu.max``) does not
count. Threads beyond the CPUs the process actually gets wait at every parallel region's barrier for a sibling that
is descheduled, and a model's many small operations turn each wait into a lost time slice: on 2 cores beside two busy
processes, 50 ring queries on the tiny model took 167 s with two threads in the LLM server and 29 s with one
(docs/deploy.md, "CPU threads"). ``agentflow`` sets ``OMP_NUM_THREADS`` to ``usable_cpus()`` at start unless it is
set already (torchrun sets 1 per rank; a deployment may set its own).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

THREADS_ENV = "OMP_NUM_THREADS"
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def usable_cpus(cpu_max: Path = CPU_MAX) -> int:
    """The CPUs in this process's affinity mask, capped by its cgroup quota (whole CPUs, at least 1)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_quota(cpu_max)
    return max(1, min(cpus, math.floor(quota)) if quota is not None else cpus)


def cgroup_quota(cpu_max: Path = CPU_MAX) -> float | None:
    """CPUs the cgroup v2 ``cpu.max`` file allows ("QUOTA PERIOD"), or None: no limit, no file, or unreadable."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return int(quota) / int(period) if quota != "max" and int(period) > 0 else None
    except (OSError, ValueError):
        return None


def default_threads(environ=os.environ) -> str:
    """Set ``OMP_NUM_THREADS`` to ``usable_cpus()`` unless it is set (call before torch is imported); its value."""
    return environ.setdefault(THREADS_ENV, str(usable_cpus()))
