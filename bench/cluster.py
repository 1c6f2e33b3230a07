"""nekomem on 1, 2, 3 nodes behind HAProxy on this machine: warm ``/cache`` throughput and
p99 side by side, the cost of the forwarding hop, and a failover timeline around kill -9.

    python -m bench.cluster [--nodes 1,2] [--seconds 10] [--clients 48] [--characters 480] [--rounds 5]
                            [--loadgen auto|wrk|python] [--cpu-per-node F] [--shards 256]

Each cluster is real: etcd (Debian's etcd-server) on a temp data dir, nekomem nodes as
``python -m nekomem serve`` processes on one shared memory root (embeddings off, no LLM,
``--actor-workers`` threads each and ``--shards`` shards: by default the settings'
defaults),
HAProxy with the shipped deploy/haproxy.cfg (consistent hashing on the character name,
then the owner learnt from the answers). Every size's cluster is started (and every
character warmed) before the first phase and runs until the last; the sizes then take
turns, one phase each, ``--rounds`` times (the order reversed every other round), and the
ratio is the median of the rounds' ratios: each round compares phases seconds apart on a
machine whose speed drifts over minutes. Before each phase the bench waits until every
cluster is idle, so that no phase pays for the work another left behind.

Every phase: ``--clients`` keep-alive HTTP/1.1 connections to HAProxy, each posting one
turn at a time to a random warm character, for ``--seconds`` after 2 s of the same load.
The load comes from wrk (Debian's package, one thread, bench/cluster_wrk.lua) when it is
installed, else from this process (asyncio on uvloop, the protocol written by hand): on 2
cores the generator's CPU is taken from the nodes being measured, and wrk's is a fraction
of the Python generator's.

Under each phase it prints the CPU each process spent per request (every node, HAProxy,
etcd, and the load generator), the cores the whole machine was busy, and how many
requests the first node forwarded: on a 2-core machine the load generator, HAProxy and
every node share the same two cores, and any other work on the machine (the idle
clusters' upkeep included) shows as "other processes and kernel".

Forwarding hop: one client, sequential requests for characters owned by node A, sent to A
directly and to node B (which forwards to A), alternating request by request: p50 of
each, for the warm ``/cache`` turn and for a ``/get_recent_history`` read.

Failover timeline (the largest cluster, at least 2 nodes, after the rounds): this process's
load (it buckets answers by second and kind) runs through HAProxy, one node is killed with SIGKILL after 5 s, and requests / errors per
second are printed (errors: 503 with Retry-After, the only error a client should see).
After the kill it prints when the rate came back: the first second whose rate reaches 90% of
the survivors' (the median of the timeline's last half), against the lease TTL + 2 s; and
the same without whole-second buckets (answers by the time they were given, one-second
windows sliding by 0.1 s: a second's bucket rounds the answer up by up to a second).
A node joining (the smallest cluster of 2 or more nodes, after the hop, ``--join-seconds``
of load with the start 3 s in): the node takes the proxy's next server slot (so the proxy
learns it) and its own CPU quota once it is up; the characters whose shard stays and those
whose shard moves to it are loaded by clients of their own (two thirds and one third), and
it prints the staying characters' rate in one-second windows sliding by 0.1 s and their
longest time without an answer, before and during the moves, and the moving characters'
longest wait.
The last lines read ``2 nodes: X.XXx the throughput of 1 node`` (and 3 nodes, when run).

``--cpu-per-node F`` measures the cluster as separate machines: each node is put in a
cgroup of its own with a CPU quota of F cores (cgroup v2 ``cpu.max`` or v1
``cpu.cfs_quota_us``, whichever is writable here; see bench/_cgroup.py), as a small machine
of its own would give it, while HAProxy, etcd and the load generator run outside the quotas
on the rest, in a group of their own without a quota. Every group is weighted like several
busy processes, so that on a machine shared with other work each node gets its quota, and
the proxy and the load generator what they need, as machines of their own would. Without
a writable cgroup it says so and runs as without the flag. Each phase's CPU line then also
shows how long each node waited for its quota.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import NamedTuple, TypeVar
from urllib.parse import urlsplit

import httpx

try:
    import uvloop
except ImportError:  # not on Windows
    uvloop = None  # type: ignore[assignment]

from bench._cgroup import CpuQuotas, open_quotas
from bench._common import smoke_option
from nekomem.cluster.ring import owner_of
from nekomem.config.cluster import ClusterSettings
from nekomem.config.server import RuntimeSettings
from nekomem.stores.shard_layout import shard_of
from tests.support.cluster import TTL, Cluster, Node, cluster

T = TypeVar("T")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Answer(NamedTuple):
    status: int
    retry_after: bool


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> tuple[Answer, bool]:
    """Send one request on a keep-alive connection and read its answer: (the answer,
    whether the connection may be reused). Raises OSError / asyncio.IncompleteReadError
    when the connection breaks."""
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    status = int(head[9:12])
    keep = b"\r\nconnection: close" not in lower
    match = _LENGTH.search(lower)
    if match is not None:
        await reader.readexactly(int(match.group(1)))
    elif b"\r\ntransfer-encoding: chunked" in lower:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    else:  # framed by the end of the connection
        await reader.read()
        keep = False
    return Answer(status, b"\r\nretry-after:" in lower), keep


_LENGTH = re.compile(rb"\r\ncontent-length: *(\d+)")


async def load(
    url: str,
    names: list[str],
    clients: int,
    seconds: float,
    timeline: dict[int, list[int]] | None = None,
    kinds: Counter[str] | None = None,
    finished: list[float] | None = None,
) -> tuple[int, list[float], int]:
    """(acknowledged requests, latencies in seconds, error answers) over ``seconds``;
    ``kinds`` counts the errors by status (and Retry-After) or exception; ``finished``
    gets the time (seconds from the start) each acknowledged request was answered.

    Each client is one keep-alive HTTP/1.1 connection speaking the protocol itself (the
    request bytes formatted, the answer framed by its Content-Length): an httpx client
    spent about as much CPU per request as the node serving it, and on a 2-core machine
    that CPU is taken from the nodes being measured (the bench prints every process's)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    latencies: list[float] = []
    errors = 0
    start = time.monotonic()
    end = start + seconds

    # Each character's request head, formatted once (the body's length filled in per request).
    heads = {
        name: (
            f"POST /cache/{name} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        ).encode()
        for name in names
    }

    async def one(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        i = 0
        while time.monotonic() < end:
            name = rng.choice(names)
            body = b'{"input_history": [{"role": "user", "content": "b%d-%d"}]}' % (seed, i)
            request = heads[name] % len(body) + body
            t0 = time.monotonic()
            kind = ""
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                answer, keep = await asyncio.wait_for(_exchange(*conn, request), 30)
                ok = answer.status == 200
                kind = f"{answer.status}{' + Retry-After' if answer.retry_after else ''}"
                if not keep:
                    conn[1].close()
                    conn = None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError) as exc:
                ok = False
                kind = type(exc).__name__
                if conn is not None:
                    conn[1].close()
                    conn = None
            if not ok and kinds is not None:
                kinds[kind] += 1
            i += 1
            second = int(t0 - start)
            if ok:
                latencies.append(time.monotonic() - t0)
                if finished is not None:
                    finished.append(time.monotonic() - start)
            else:
                errors += 1
            if timeline is not None:
                timeline.setdefault(second, [0, 0])[0 if ok else 1] += 1
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(one(s) for s in range(clients)))
    return len(latencies), latencies, errors


class Phase(NamedTuple):
    """One measured load phase: acknowledged requests, p50 and p99 latency in seconds,
    error answers, and how long it ran."""

    count: int
    p50: float
    p99: float
    errors: int
    seconds: float


WRK = shutil.which("wrk")
WRK_SCRIPT = Path(__file__).with_name("cluster_wrk.lua")


def wrk_load(url: str, names: list[str], clients: int, seconds: float) -> Phase:
    """The same load as :func:`load` (``clients`` keep-alive connections posting one turn at
    a time to a random character), generated by wrk (Debian's package) on one thread: it
    spends a fraction of the CPU per request the Python generator does, CPU that on a
    2-core machine the nodes being measured would otherwise lose. Raises SystemExit when
    wrk fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listing:
        listing.write("\n".join(names) + "\n")
        listing.flush()
        command = [WRK or "wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--timeout", "30s"]
        command += ["-s", str(WRK_SCRIPT), url, "--", listing.name]
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    line = next((x for x in done.stdout.splitlines() if x.startswith("NEKOMEM ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed ({done.returncode}): {done.stderr[-500:] or done.stdout[-500:]}")
    requests, connect, read, write, status, timeouts = (int(v) for v in line.split()[1:7])
    p50, p99, took = (float(v) / 1e6 for v in line.split()[7:10])
    errors = connect + read + write + status + timeouts
    return Phase(requests - status, p50, p99, errors, took)


def python_load(url: str, names: list[str], clients: int, seconds: float) -> Phase:
    """:func:`load` as a :class:`Phase`."""
    count, latencies, errors = run(load(url, names, clients, seconds))
    return Phase(count, pct(latencies, 0.5), pct(latencies, 0.99), errors, seconds)


def run(main: Coroutine[object, object, T]) -> T:
    """Run the load generator's coroutine on uvloop where it is installed (it is, with
    nekomem's server extras): on asyncio's own loop (with each request formatted whole)
    the generator spent 0.09-0.12 ms of CPU per request, on uvloop 0.06-0.09 ms, taken on
    a 2-core machine from the nodes being measured."""
    if uvloop is not None:
        return uvloop.run(main)
    return asyncio.run(main)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (every thread), from /proc."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` (every thread), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


def busy_seconds() -> float:
    """CPU seconds the whole machine spent not idle (every core), from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:8]]
    return (sum(values) - values[3] - values[4]) / _TICK  # minus idle and iowait


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's finished children (wrk's runs)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


class CpuShare:
    """Where the CPU went during one phase: every process of the cluster and the load
    generator (this process, or the wrk it ran), and the machine as a whole."""

    def __init__(self, c: Cluster, quotas: CpuQuotas | None = None) -> None:
        self.quotas = quotas
        self.pids = {n.node_id: n.proc.pid for n in c.nodes if n.proc is not None}
        self.nodes = set(self.pids)
        if c.proxy.proc is not None:
            self.pids["haproxy"] = c.proxy.proc.pid
        if c.etcd.proc is not None:
            self.pids["etcd"] = c.etcd.proc.pid
        self.pids["loadgen"] = os.getpid()
        self.before = {k: cpu_split(p) for k, p in self.pids.items()}
        self.children = children_cpu_seconds()
        self.size = len(c.nodes)
        self.throttled = {k: quotas.throttled(f"{self.size}-{k}") for k in self.nodes} if quotas is not None else {}
        self.busy = busy_seconds()
        self.t0 = time.monotonic()

    def report(self, requests: int) -> str:
        wall = time.monotonic() - self.t0
        split = {k: [now - then for now, then in zip(cpu_split(p), self.before[k], strict=True)] for k, p in self.pids.items()}
        split["loadgen"][0] += children_cpu_seconds() - self.children  # wrk, when it generated the load
        used = {k: user + system for k, (user, system) in split.items()}
        busy = busy_seconds() - self.busy

        def one(k: str, v: float) -> str:
            # A node's kernel share: the part of its CPU that runs outside the interpreter
            # lock (fsync, file and socket calls), beside its one core of Python.
            kernel = f", {split[k][1] / wall:.2f} in the kernel" if k in self.nodes else ""
            if k in self.throttled and self.quotas is not None:
                waited = self.quotas.throttled(f"{self.size}-{k}") - self.throttled[k]
                kernel += f", throttled {waited / wall:.2f} s/s"
            return f"{k} {v / max(requests, 1) * 1000:.2f} ms ({v / wall:.2f} core{kernel})"

        per = ", ".join(one(k, v) for k, v in used.items())
        rest = busy - sum(used.values())
        return (
            f"    CPU per request: {per}; machine busy {busy / wall:.2f} of {os.cpu_count()} cores "
            f"(other processes and kernel {rest / wall:.2f})"
        )


def settle(clusters: list[Cluster], *, below: float = 0.05, window: float = 0.5, limit: float = 20.0) -> float:
    """Wait until every process of ``clusters`` together uses less than ``below`` core over
    a ``window`` (at most ``limit`` seconds); the seconds waited. A cluster keeps working
    for a while after its phase (post-turn records, outbox syncs, checkpoints): measured
    without this, a phase right after another cluster's ran up to a seventh slower than
    one after its own."""
    pids = [p.pid for c in clusters for p in (*(n.proc for n in c.nodes), c.proxy.proc, c.etcd.proc) if p is not None]
    start = time.monotonic()
    while True:
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(window)
        if sum(cpu_seconds(pid) for pid in pids) - before < below * window or time.monotonic() - start > limit:
            return time.monotonic() - start


def warm(c: Cluster, names: list[str]) -> None:
    """One turn for every character through HAProxy (the proxy learns each owner). A 5xx or
    an answer with Retry-After (HAProxy still taking the unused slots out, a node's fence not
    yet renewed on a busy machine) is retried, for up to 30 s."""
    with httpx.Client(base_url=c.proxy.url, timeout=30) as client:
        for name in names:
            deadline = time.monotonic() + 30
            while True:
                r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": "warm"}]})
                if r.status_code == 200:
                    break
                if (r.status_code < 500 and not r.headers.get("retry-after")) or time.monotonic() > deadline:
                    raise SystemExit(f"warm-up of {name} failed: {r.status_code} {r.text[:200]}")
                print(f"warm-up: {r.status_code} {r.text[:120]}", flush=True)
                time.sleep(0.2)


def hop_cost(c: Cluster, names: list[str], requests: int) -> dict[str, tuple[float, float]]:
    """p50 of (direct to the owner, through another node) in seconds, for a warm ``/cache``
    turn (the request the throughput phases send) and a ``/get_recent_history`` read. The
    two ways alternate request by request, so that other work on the machine weighs on
    both alike."""
    members = sorted(n.node_id for n in c.nodes)
    a, b = c.nodes[0], c.nodes[1]
    owned = [n for n in names if owner_of(shard_of(n, c.shards), members) == a.node_id] or names[:1]
    result: dict[str, tuple[float, float]] = {}
    with httpx.Client(base_url=a.url, timeout=30) as direct, httpx.Client(base_url=b.url, timeout=30) as forwarded:
        for what in ("POST /cache", "GET /get_recent_history"):
            times: tuple[list[float], list[float]] = ([], [])
            for i in range(requests):
                name = owned[i % len(owned)]
                for way, client in enumerate((direct, forwarded) if i % 2 == 0 else (forwarded, direct)):
                    t0 = time.perf_counter()
                    if what == "POST /cache":
                        r = client.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": f"hop-{i}-{way}"}]})
                    else:
                        r = client.get(f"/get_recent_history/{name}")
                    elapsed = time.perf_counter() - t0
                    if r.status_code != 200:
                        raise SystemExit(f"hop: {what} answered {r.status_code}: {r.text[:200]}")
                    times[0 if client is direct else 1].append(elapsed)
            result[what] = (statistics.median(times[0]), statistics.median(times[1]))
    return result


async def failover(
    c: Cluster,
    names: list[str],
    clients: int,
    seconds: float,
    timeline: dict[int, list[int]],
    kinds: Counter[str],
    finished: list[float] | None = None,
) -> float:
    """The load through HAProxy with the last node killed (SIGKILL) 5 s in (a quarter of the
    way through a shorter run); the kill's second."""
    kill_at = min(5.0, seconds / 4)
    task = asyncio.create_task(load(c.proxy.url, names, clients, seconds, timeline, kinds, finished))
    await asyncio.sleep(kill_at)
    c.nodes[-1].kill()
    await task
    return kill_at


def prepared_counts(c: Cluster) -> dict[str, dict[str, int]]:
    """Each live node's characters loaded ahead of a claim while the dead node's lease ran
    out (nekomem_cluster_prepared_characters_total, by outcome)."""
    counts: dict[str, dict[str, int]] = {}
    for node in c.nodes[:-1]:
        try:
            text = httpx.get(node.url + "/metrics", timeout=10).text
        except httpx.HTTPError:
            continue
        for match in re.finditer(r'^nekomem_cluster_prepared_characters_total\{outcome="(\w+)"\} ([0-9.e+]+)$', text, re.M):
            counts.setdefault(node.node_id, {})[match.group(1)] = int(float(match.group(2)))
    return counts


class JoinRun(NamedTuple):
    """One join under load: answer times (seconds from the load's start) of the characters
    whose shard stays where it is and of those whose shard moves to the new node, the
    latencies of each, their error answers, and when the node was started and when every
    shard was settled again."""

    stay: list[float]
    move: list[float]
    stay_latency: list[float]
    move_latency: list[float]
    errors: tuple[int, int]
    kinds: Counter[str]
    started: float
    ready: float
    settled: float


async def join(
    c: Cluster, names: list[str], clients: int, seconds: float, env: dict[str, str], confine: Callable[[Node], None] | None
) -> JoinRun | None:
    """Load through HAProxy on ``c`` while a node joins 3 s in: the characters that stay
    and those that move to it are loaded by clients of their own (two thirds and one third
    of ``clients``), as independent users would be, so that a request waiting on a moving
    shard does not hold up a client of the others. The node gets ``env`` as the others did,
    and the proxy's next server slot when its configuration has one left (else the proxy
    does not know it and its characters reach it through a hop); ``confine`` puts it under
    its CPU quota once it is up. None when no character moves
    (or none stays)."""
    shards = c.shards
    before = sorted(n.node_id for n in c.nodes)
    joiner = f"n{len(c.nodes) + 1}"
    after = sorted([*before, joiner])
    move = [n for n in names if owner_of(shard_of(n, shards), before) != owner_of(shard_of(n, shards), after)]
    moving = set(move)
    stay = [n for n in names if n not in moving]
    if not move or not stay:
        return None
    movers = max(1, clients // 3)
    stay_times: list[float] = []
    move_times: list[float] = []
    kinds: Counter[str] = Counter()
    marks: dict[str, float] = {}
    start = time.monotonic()

    # The proxy's configuration names three servers: a joiner of a smaller cluster takes
    # the next one's port and slot, so that the proxy sends its characters to it as it
    # would to a node added to a deployment.
    slot = len(c.nodes) + 1
    address = c.proxy.env.get(f"NEKOMEM_NODE{slot}", "")
    joined_env = dict(env)
    port: int | None = None
    if slot <= 3 and address:
        port = int(address.rsplit(":", 1)[1])
        joined_env["NEKOMEM_CLUSTER_PROXY_SLOT"] = str(slot)

    def add() -> None:
        marks["started"] = time.monotonic() - start
        node = c.add_node(joiner, port=port, **joined_env)
        marks["ready"] = time.monotonic() - start
        if confine is not None:
            confine(node)
        deadline = time.monotonic() + 60
        while not c.settled(set(after)) and time.monotonic() < deadline:
            time.sleep(0.1)
        marks["settled"] = time.monotonic() - start

    async def later() -> None:
        await asyncio.sleep(3.0)
        await asyncio.to_thread(add)

    (_, stay_lat, stay_err), (_, move_lat, move_err), _ = await asyncio.gather(
        load(c.proxy.url, stay, clients - movers, seconds, kinds=kinds, finished=stay_times),
        load(c.proxy.url, move, movers, seconds, kinds=kinds, finished=move_times),
        later(),
    )
    return JoinRun(
        stay_times,
        move_times,
        stay_lat,
        move_lat,
        (stay_err, move_err),
        kinds,
        marks.get("started", 3.0),
        marks.get("ready", seconds),
        marks.get("settled", seconds),
    )


def join_report(r: JoinRun) -> list[str]:
    """What the others' traffic saw while a node joined: the rate of the staying
    characters in one-second windows sliding by 0.1 s, the lowest from the node's start
    until 1 s after the shards settled against the median before it, and the longest time
    without any answer to them, before and during; for the moving ones, the longest
    request (their wait for the hand-over) and how many answered."""
    lines: list[str] = []
    end = max([*r.stay, *r.move], default=0.0)
    lo, hi = r.started, min(r.settled + 1.0, end)

    def gap(times: list[float], a: float, b: float) -> float:
        t = [x for x in sorted(times) if a <= x <= b]
        return max((y - x for x, y in zip(t, t[1:], strict=False)), default=b - a)

    stay = sorted(r.stay)
    before = [n for _, n in sliding_counts(stay, 0.5, lo)]
    during = [n for _, n in sliding_counts(stay, lo, hi)]
    if not before or not during:
        return ["join: the run is too short to tell"]
    base = statistics.median(before)
    low = min(during)
    lines.append(
        f"staying characters: {base:.0f}/s before the join; lowest one-second window from the node's start to 1 s after "
        f"the shards settled ({hi - lo:.1f} s): {low:.0f}/s = {low / base:.0%}"
    )
    # load() appends an answer's latency and its time together: the same index.
    lat_before = [x for x, t in zip(r.stay_latency, r.stay, strict=True) if t < lo]
    lat_during = [x for x, t in zip(r.stay_latency, r.stay, strict=True) if lo <= t <= hi]
    lines.append(
        f"staying characters: longest time without an answer {gap(r.stay, 0.5, lo) * 1000:.0f} ms before the join, "
        f"{gap(r.stay, lo, hi) * 1000:.0f} ms during it; p99 latency {pct(lat_before, 0.99) * 1000:.1f} ms before, "
        f"{pct(lat_during, 0.99) * 1000:.1f} ms during (longest {max(lat_during, default=0.0) * 1000:.0f} ms); "
        f"errors {r.errors[0]}"
    )
    longest = max(range(len(r.move_latency)), key=r.move_latency.__getitem__, default=None)
    when = "" if longest is None else f", answered {r.move[longest] - r.started:.1f} s after the node's start"
    lines.append(
        f"moving characters: {len(r.move)} answers, longest request {max(r.move_latency, default=0.0) * 1000:.0f} ms "
        f"(waiting for the hand-over{when}), errors {r.errors[1]}"
    )
    if r.kinds:
        lines.append("errors by kind (both groups): " + ", ".join(f"{k}: {n}" for k, n in r.kinds.most_common()))
    # A pause: a time with no answer at all to the characters that do not move (bound
    # 250 ms, a few times the latency under this load); beside it, the rate they kept.
    stalled = gap(r.stay, lo, hi)
    verdict = "no pause" if stalled <= 0.25 and not r.errors[0] else "a PAUSE"
    kept = "kept" if low >= 0.9 * base else "NOT kept"
    lines.append(
        f"the others' traffic while a node joined: {verdict} (longest time without an answer {stalled * 1000:.0f} ms, "
        f"bound 250 ms; errors {r.errors[0]}); their rate {kept} (lowest window {low / base:.0%} of the rate before, bound 90%)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2", help="cluster sizes, comma-separated (1 to 3: the shipped HAProxy config names three)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--clients",
        type=int,
        default=48,
        help="concurrent load-generator connections (default 48: fewer leave a 2-node cluster waiting on latency)",
    )
    parser.add_argument(
        "--characters",
        type=int,
        default=480,
        help="warm characters (default 480: with 48, consistent hashing gave one node a fifth more of the load)",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="phases per size, the sizes taking turns; the ratio is the median of the rounds'"
    )
    parser.add_argument(
        "--actor-workers",
        type=int,
        default=RuntimeSettings().actor_workers,
        help="each node's actor_workers (default: the setting's default, as a deployed node runs; the test fixture's nodes run 1)",
    )
    parser.add_argument(
        "--loadgen",
        choices=["auto", "wrk", "python"],
        default="auto",
        help="what generates the throughput phases' load: wrk (auto: when installed) or this process (asyncio on uvloop); "
        "the failover timeline is always this process's",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=ClusterSettings().cluster_shards,
        help="each node's cluster_shards (default: the setting's default, as deployed; the test fixture's nodes run 64, "
        "which splits 480 characters among 2 or 3 nodes less evenly: the busiest node sets the pace)",
    )
    parser.add_argument("--hop-requests", type=int, default=300)
    parser.add_argument("--failover-seconds", type=float, default=20.0)
    parser.add_argument(
        "--join-seconds",
        type=float,
        default=12.0,
        help="load while a node joins the smallest cluster of 2 or more nodes, 3 s in (0: no join)",
    )
    parser.add_argument(
        "--cpu-per-node",
        type=float,
        default=0.0,
        help="a CPU quota of this many cores for each node, in a cgroup of its own (0: none): the cluster as separate machines",
    )
    smoke_option(
        parser,
        None,
        nodes="1,2",
        seconds=1.0,
        clients=4,
        characters=8,
        rounds=1,
        loadgen="python",
        hop_requests=20,
        failover_seconds=3.0,
        join_seconds=6.0,
    )
    args = parser.parse_args()
    node_env = {"NEKOMEM_ACTOR_WORKERS": str(args.actor_workers), "NEKOMEM_CLUSTER_SHARDS": str(args.shards)}
    if args.loadgen == "wrk" and WRK is None:
        raise SystemExit("--loadgen wrk: wrk is not installed (apt-get install wrk)")
    generate = wrk_load if args.loadgen == "wrk" or (args.loadgen == "auto" and WRK is not None) else python_load
    print(
        f"load generator: {'wrk' if generate is wrk_load else 'python (asyncio on uvloop)' if uvloop else 'python (asyncio)'}", flush=True
    )
    quotas: CpuQuotas | None = None
    if args.cpu_per_node > 0:
        quotas, why = open_quotas()
        if quotas is None:
            print(f"--cpu-per-node {args.cpu_per_node}: no writable cgroup here ({why}); running without quotas", flush=True)
        else:
            print(f"each node limited to {args.cpu_per_node} core(s): {quotas.describe()}", flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores", flush=True)
    sizes = [int(n) for n in args.nodes.split(",")]
    names = [f"bench{i:03d}" for i in range(args.characters)]
    rows: dict[int, list[tuple[float, float, float, int]]] = {size: [] for size in sizes}  # (req/s, p50, p99, errors)
    hop: dict[str, tuple[float, float]] = {}
    timeline: dict[int, list[int]] = {}
    finished: list[float] = []
    kinds: Counter[str] = Counter()
    killed_at = 0.0
    prepared: dict[str, dict[str, int]] = {}
    joined: JoinRun | None = None
    joined_size = 0
    with contextlib.ExitStack() as stack:
        if quotas is not None:
            stack.callback(quotas.close)
            quotas.weigh(os.getpid(), "rest")  # etcd, HAProxy and wrk start from here: they inherit it
        # Every size's cluster runs for the whole bench, and the sizes take turns, a phase
        # each: the ratio compares phases seconds apart, not clusters started minutes apart
        # on a machine whose speed drifts (the idle cluster's upkeep is small, and shows as
        # "other processes" in the CPU line).
        clusters: dict[int, Cluster] = {}
        for size in sizes:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="nekomem-cluster-bench-"))
            clusters[size] = stack.enter_context(cluster(Path(tmp), size=size, **node_env))
            if quotas is not None:
                for node in clusters[size].nodes:
                    assert node.proc is not None
                    quotas.confine(node.proc.pid, f"{size}-{node.node_id}", args.cpu_per_node)
            warm(clusters[size], names)
        for round_ in range(1, args.rounds + 1):
            for size in sizes if round_ % 2 else sizes[::-1]:
                c = clusters[size]
                waited = settle(list(clusters.values()))
                generate(c.proxy.url, names, args.clients, min(2.0, args.seconds))  # connections and caches warm
                share, forwards = CpuShare(c, quotas), c.forwards()
                count, p50, p99, errors, took = generate(c.proxy.url, names, args.clients, args.seconds)
                cpu = share.report(count)
                forwarded = c.forwards() - forwards
                row = (count / took, p50, p99, errors)
                rows[size].append(row)
                print(
                    f"round {round_}: {size} node(s): {row[0]:8.1f} req/s  p50 {row[1] * 1000:6.1f} ms  p99 {row[2] * 1000:6.1f} ms  errors {errors}",
                    flush=True,
                )
                print(
                    f"{cpu}\n    forwarded by the first node: {forwarded} of {count}; waited {waited:.1f} s for every cluster to idle",
                    flush=True,
                )
        several = [size for size in sizes if size >= 2]
        if several:
            hop = hop_cost(clusters[several[0]], names, args.hop_requests)
        if several and args.join_seconds > 0:
            confine: Callable[[Node], None] | None = None
            if quotas is not None:
                q = quotas

                def confine(node: Node) -> None:  # the joiner under its quota, as the others
                    assert node.proc is not None
                    q.confine(node.proc.pid, f"join-{node.node_id}", args.cpu_per_node)

            joined_size = several[0]
            joined = run(join(clusters[joined_size], names, args.clients, args.join_seconds, node_env, confine))
        if several and args.failover_seconds > 0:
            killed_at = run(failover(clusters[max(sizes)], names, args.clients, args.failover_seconds, timeline, kinds, finished))
            prepared = prepared_counts(clusters[max(sizes)])
    print()
    print(f"{'nodes':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}   (median of {args.rounds} round(s))")
    for size, runs in rows.items():
        rps, p50, p99 = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{size:>5} {rps:>9.1f} {p50 * 1000:>8.1f} {p99 * 1000:>8.1f} {sum(r[3] for r in runs):>7}")
    for what, (direct, through) in hop.items():
        print(
            f"\nforwarding hop ({what}, sequential, alternating): direct p50 {direct * 1000:.2f} ms, "
            f"forwarded p50 {through * 1000:.2f} ms, {through / direct:.2f}x",
            end="",
        )
    if hop:
        print()
    if timeline:
        print(f"\nfailover timeline ({max(sizes)} nodes, kill -9 of one at t={killed_at:.0f}s): second  ok/s  errors/s")
        for second in range(max(timeline) + 1):
            ok, bad = timeline.get(second, [0, 0])
            mark = "  <- kill -9" if second == int(killed_at) else ""
            print(f"  {second:>3}  {ok:>5}  {bad:>5}{mark}")
        print(
            "  errors by kind (bucketed by the second the request started): "
            + (", ".join(f"{k}: {n}" for k, n in kinds.most_common()) or "none")
        )
        print("  " + recovery(timeline, killed_at, TTL))
        print("  " + recovery_fine(finished, killed_at, TTL))
        print(
            "  loaded ahead of the claim while the lease ran out: "
            + (
                ", ".join(
                    f"{node} {n.get('prepared', 0)} (served as loaded {n.get('adopted', 0)}, loaded again {n.get('stale', 0)})"
                    for node, n in sorted(prepared.items())
                )
                or "none"
            )
        )
    if joined is not None:
        print(
            f"\na node joining the {joined_size}-node cluster under load (started {joined.started:.1f} s in, serving "
            f"{joined.ready - joined.started:.1f} s later, every shard settled {joined.settled - joined.started:.1f} s after its start):"
        )
        for line in join_report(joined):
            print("  " + line)
    elif args.join_seconds > 0 and len([s for s in sizes if s >= 2]):
        print("\njoin: no character moves to the new node (or none stays); nothing to compare")
    for size in sorted(s for s in rows if s >= 2):
        if not rows.get(1) or not rows[size]:
            continue
        ratios = [many[0] / one[0] for one, many in zip(rows[1], rows[size], strict=True)]
        if len(ratios) > 1:
            print(f"per round ({size} nodes): " + ", ".join(f"{r:.2f}x" for r in ratios))
        print(f"{size} nodes: {statistics.median(ratios):.2f}x the throughput of 1 node")


def recovery(timeline: dict[int, list[int]], killed: float, ttl: int) -> str:
    """When the rate came back after the kill at ``killed`` seconds: the first second after
    the kill's whose acknowledged requests reach 90% of the survivors' rate (the median of
    the timeline's last half after the kill; a second in which no request started counts
    0), beside the bound lease TTL + 2 s, measured from the kill to that second's end."""
    last = max(timeline, default=0)
    seconds = list(range(int(killed) + 1, last + 1))
    if len(seconds) < 4:
        return "full rate again: the timeline is too short to tell"
    ok = {s: timeline.get(s, [0, 0])[0] for s in range(last + 1)}
    before = [ok[s] for s in range(1, int(killed))]
    after = statistics.median(ok[s] for s in seconds[len(seconds) // 2 : -1] or seconds[-1:])
    back = next((s for s in seconds if ok[s] >= 0.9 * after), seconds[-1])
    took = back + 1 - killed
    was = f"{statistics.median(before):.0f}/s before the kill, " if before else ""
    verdict = "within" if took <= ttl + 2 else "NOT within"
    return (
        f"full rate again ({was}survivors {after:.0f}/s): by the end of second {back}, {took:.1f} s after the kill "
        f"({verdict} the lease TTL {ttl} s + 2 s)"
    )


def sliding_counts(times: list[float], first: float, last: float, step: float = 0.1) -> list[tuple[float, int]]:
    """(start, answers) of the one-second windows ``[t, t + 1)`` for ``t`` = ``first``,
    ``first + step``, ... while a window ends by ``last`` (at least one); ``times`` sorted."""
    starts = [first + i * step for i in range(max(0, int((last - 1.0 - first) / step)) + 1)]
    return [(t, bisect.bisect_left(times, t + 1.0) - bisect.bisect_left(times, t)) for t in starts]


def recovery_fine(finished: list[float], killed: float, ttl: int, step: float = 0.1) -> str:
    """When the rate came back, without the whole-second buckets of :func:`recovery` (they
    put up to a second of rounding on the answer): answers counted by the time they were
    given, in one-second windows sliding by ``step``. The survivors' rate is the median of
    the whole windows in the last half after the kill; the rate is back at the end of the
    first window from the kill that reaches 90% of it."""
    times = sorted(finished)
    end = times[-1] if times else 0.0
    if end - killed < 4:
        return "full rate again (answers, 1 s windows sliding by 0.1 s): the run is too short to tell"

    windows = sliding_counts(times, killed, end, step)
    after = statistics.median(n for _, n in windows[len(windows) // 2 :])
    back = next((t for t, n in windows if n >= 0.9 * after), windows[-1][0])
    took = back + 1.0 - killed
    verdict = "within" if took <= ttl + 2 else "NOT within"
    return (
        f"full rate again (answers by the time given, 1 s windows sliding by {step} s; survivors {after:.0f}/s): "
        f"the window from {back - killed:.1f} s after the kill, so by {took:.1f} s ({verdict} the lease TTL {ttl} s + 2 s)"
    )


if __name__ == "__main__":
    main()
