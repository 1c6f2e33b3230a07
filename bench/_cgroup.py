"""A CPU quota per process, from a cgroup of its own: what a separate small machine gives a
node, on a machine the bench shares with its other processes.

cgroup v2 (``cpu.max`` in a group under a hierarchy whose ``cgroup.controllers`` lists
``cpu``) or cgroup v1 (``cpu.cfs_quota_us`` under the ``cpu`` controller's mount), whichever
this machine has writable (it takes root, or a delegated group). :func:`open_quotas` answers
None with the reason when neither is, and the bench then runs without quotas.
"""

from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 100_000  # the kernel's default CFS period: 100 ms
# A group competes for the CPU as one entity against every process outside groups, each
# of those at the default weight (1024 / v2 100). On a machine shared with busy processes a
# node in a group of default weight got less than its quota (0.22-0.27 of 0.45 core under
# a load average of 12), and weighted like 8 busy processes (8192 / 800) still 0.18-0.44
# of it in the 3-node phases under a load average of 15-19: four such groups (three nodes
# and the rest) against 15 busy processes get 8192 / (4 * 8192 + 15 * 1024) of 2 cores,
# 0.34 core each. At the largest weight the kernel takes (v1 262144, v2 10000) a group
# gets what it asks for up to its quota whatever else runs: what a machine of its own
# would give, and no more (the quota caps the nodes).
WEIGHT_V1, WEIGHT_V2 = 262144, 10000


def _v2_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = root / "cgroup.controllers"
        if controllers.is_file() and "cpu" in controllers.read_text().split():
            return root
    return None


def _v1_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct")):
        if (root / "cpu.cfs_quota_us").is_file():
            return root
    return None


class CpuQuotas:
    """Groups named ``nekomem-bench-<pid>-<label>`` under one cgroup hierarchy, each with a
    quota of some cores; :meth:`close` moves what is left in them back and removes them."""

    def __init__(self, root: Path, version: int) -> None:
        self.root, self.version = root, version
        self.groups: list[Path] = []

    def describe(self) -> str:
        knob = "cpu.max" if self.version == 2 else "cpu.cfs_quota_us"
        return f"cgroup v{self.version} {knob} under {self.root}"

    def confine(self, pid: int, label: str, cores: float) -> None:
        """Put process ``pid`` (every thread) in a group of its own limited to ``cores``
        cores, weighted so that it gets them on a busy machine. Raises OSError when the
        group cannot be made or written."""
        group = self.root / f"nekomem-bench-{os.getpid()}-{label}"
        group.mkdir(exist_ok=True)
        self.groups.append(group)
        quota = max(1000, round(cores * PERIOD_US))
        if self.version == 2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
            (group / "cpu.weight").write_text(f"{WEIGHT_V2}\n")
        else:
            (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            (group / "cpu.shares").write_text(f"{WEIGHT_V1}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")

    def weigh(self, pid: int, label: str) -> None:
        """Put process ``pid`` in a group of its own without a quota but with the nodes'
        weight: on a shared machine the bench's other processes (HAProxy, etcd, the load
        generator, each a machine of its own in a real deployment) were starved by the
        machine's other work, and the nodes waited for requests. Processes ``pid`` starts
        later are in the group too. Raises OSError."""
        group = self.root / f"nekomem-bench-{os.getpid()}-{label}"
        group.mkdir(exist_ok=True)
        self.groups.append(group)
        if self.version == 2:
            (group / "cpu.weight").write_text(f"{WEIGHT_V2}\n")
        else:
            (group / "cpu.shares").write_text(f"{WEIGHT_V1}\n")
        (group / "cgroup.procs").write_text(f"{pid}\n")

    def throttled(self, label: str) -> float:
        """Seconds the group ``label``'s processes waited for their quota so far (0 when unknown)."""
        group = self.root / f"nekomem-bench-{os.getpid()}-{label}"
        try:
            stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
        except (OSError, ValueError):
            return 0.0
        if "throttled_usec" in stat:
            return int(stat["throttled_usec"]) / 1e6
        return int(stat.get("throttled_time", 0)) / 1e9

    def close(self) -> None:
        for group in reversed(self.groups):
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
                group.rmdir()
            except OSError:
                pass  # a process that is exiting; the group is left behind, empty soon
        self.groups.clear()


def open_quotas() -> tuple[CpuQuotas | None, str]:
    """Writable CPU quotas on this machine, or None and why not: tries a throw-away group
    under cgroup v2, then v1."""
    reasons = []
    for version, root in ((2, _v2_root()), (1, _v1_root())):
        if root is None:
            reasons.append(f"no cgroup v{version} cpu controller")
            continue
        probe = root / f"nekomem-bench-{os.getpid()}-probe"
        try:
            probe.mkdir(exist_ok=True)
            knob = probe / ("cpu.max" if version == 2 else "cpu.cfs_quota_us")
            knob.write_text(f"{PERIOD_US} {PERIOD_US}\n" if version == 2 else f"{PERIOD_US}\n")
            probe.rmdir()
        except OSError as exc:
            reasons.append(f"cgroup v{version} at {root} not writable ({exc.strerror or exc})")
            continue
        return CpuQuotas(root, version), ""
    return None, "; ".join(reasons)
