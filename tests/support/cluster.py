"""Real cluster parts for tests: etcd (Debian's etcd-server), nekomem nodes as
``python -m nekomem serve`` processes on one shared memory root, and HAProxy with the
shipped deploy/haproxy.cfg. Every port is ephemeral; every process is stopped on exit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from nekomem.stores.shard_layout import character_root
from tests.support.live import ROOT, ServerProcess, free_port
from tests.support.waiting import wait_for

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
TTL = 3  # seconds: short, so failover tests stay short
SHARDS = 64
# Deadlines of the waits, from the TTL. They only bound a hang (every wait polls a real
# condition): on a loaded 2-core machine a move, a failover or a burst of load can take many
# times what it takes on an idle one, so they are generous. SETTLE: every shard owned again
# after a node joins, leaves or dies (the bound for a failover is TTL + 5 s; the
# bench measures it). PROGRESS: a load makes some progress.
SETTLE = 30 * TTL
PROGRESS = 40 * TTL
# How long a client retries an answer it is told to retry (503 / 409 with Retry-After): a
# node whose keepalive was late on a busy machine refuses writes until the next one
# succeeds, within a tick or two.
RETRY_WINDOW = 10 * TTL


def post_turn(client: httpx.Client, url: str, name: str, text: str, *, key: str | None = None) -> httpx.Response:
    """POST one /cache turn with an Idempotency-Key, retrying the same key on an answer with
    Retry-After (503 / 409) for up to RETRY_WINDOW seconds, as a client is told to; the last
    answer."""
    headers = {"Idempotency-Key": key or uuid.uuid4().hex}
    deadline = time.monotonic() + RETRY_WINDOW
    while True:
        r = client.post(f"{url}/cache/{name}", json={"input_history": [{"role": "user", "content": text}]}, headers=headers)
        if r.status_code not in (503, 409) or not r.headers.get("retry-after") or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def require_tools() -> None:
    if os.environ.get("CI") == "true":
        return  # CI installs them (make test): a missing tool must fail, not skip
    for tool in (ETCD, HAPROXY):
        if not os.access(tool, os.X_OK):
            pytest.skip(f"{tool} is not installed (apt-get install etcd-server haproxy)")


class Etcd:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.peer = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.folder / "etcd.log", "ab")
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name",
                "test",
                "--data-dir",
                str(self.folder / "etcd-data"),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{self.peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{self.peer}",
                "--initial-cluster",
                f"test=http://127.0.0.1:{self.peer}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        log.close()
        wait_for(self._ready, timeout=20 * TTL, what="etcd")

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Node(ServerProcess):
    def __init__(self, memory_root: Path, etcd: Etcd, node_id: str, port: int | None = None, **extra: str) -> None:
        port = port or free_port()
        env = {
            "NEKOMEM_EMBEDDING_ENABLED": "false",  # four interpreters on two cores: no model
            "NEKOMEM_CLUSTER_ETCD_URL": etcd.url,
            "NEKOMEM_CLUSTER_NODE_ID": node_id,
            "NEKOMEM_CLUSTER_ADVERTISE_URL": f"http://127.0.0.1:{port}",
            "NEKOMEM_CLUSTER_LEASE_TTL_SECONDS": str(TTL),
            "NEKOMEM_CLUSTER_SHARDS": str(SHARDS),
            "NEKOMEM_CLUSTER_POLL_SECONDS": "0.5",
            "NEKOMEM_CLUSTER_OWNER_WAIT_SECONDS": str(TTL + 4),
            "NEKOMEM_ACTOR_WORKERS": "1",
            **extra,
        }
        super().__init__(memory_root, env=env, port=port)
        self.node_id = node_id
        self.log_path = memory_root.parent / f"node-{node_id}.log"

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5).json()

    def owned(self) -> int:
        try:
            return int(self.health()["cluster"]["shards_owned"])
        except (httpx.HTTPError, ValueError, KeyError):
            return -1

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


class HAProxy:
    def __init__(self, folder: Path, nodes: list[Node]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.folder = folder
        self.env = {**os.environ, "HAPROXY_BIND": f"127.0.0.1:{self.port}"}
        for i in range(1, 4):
            # The shipped config names three servers; with fewer nodes the rest point at a
            # port nobody listens on, which the health check takes out of the ring.
            port = nodes[i - 1].port if i <= len(nodes) else free_port()
            self.env[f"NEKOMEM_NODE{i}"] = f"127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.folder / "haproxy.log", "ab")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(HAPROXY_CFG)], env=self.env, stdout=log, stderr=log)
        log.close()
        wait_for(self._ready, timeout=20 * TTL, what="haproxy")

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Cluster:
    def __init__(self, folder: Path, etcd: Etcd, nodes: list[Node], proxy: HAProxy, shards: int = SHARDS) -> None:
        self.folder, self.etcd, self.nodes, self.proxy = folder, etcd, nodes, proxy
        self.root = folder / "memory"
        self.shards = shards  # the nodes' cluster_shards

    def add_node(self, node_id: str, port: int | None = None, **extra: str) -> Node:
        """Start one more node (on ``port`` when given: the port of a server the proxy's
        configuration names and nobody serves yet, so that the proxy routes to it)."""
        node = Node(self.root, self.etcd, node_id, port=port, **extra)
        node.start(timeout=120)
        self.nodes.append(node)
        return node

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def status(self, via: Node | None = None) -> dict:
        node = via or self.live()[0]
        return httpx.get(node.url + "/cluster/status", headers={"x-nekomem-forwarded-by": "test"}, timeout=10).json()

    def owners(self, via: Node | None = None) -> dict[str, int]:
        node = via or self.live()[0]
        return self.status(node)["nodes"][node.node_id]["owners"]

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def settled(self, owners: set[str], members: set[str] | None = None) -> bool:
        """Every shard owned and ready, by exactly the ``owners`` nodes, as seen by each of
        them, with ``members`` (default: the owners) live."""
        members = members or owners
        try:
            for node_id in owners:
                node = self.node(node_id)
                view = self.status(node)["nodes"][node_id]
                if set(view["nodes"]) != members or view["moving"] or sum(view["owners"].values()) != self.shards:
                    return False
                if set(view["owners"]) != owners:
                    return False
            return sum(self.node(n).owned() for n in owners) == self.shards
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    def folder_of(self, name: str) -> Path:
        return character_root(self.root, name, self.shards) / name

    def stored(self, name: str) -> list[str]:
        db_path = self.folder_of(name) / "time_indexed.db"
        if not db_path.exists():
            return []
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original")]
        finally:
            db.close()

    def forwards(self) -> int:
        """Requests forwarded so far, summed over the live nodes."""
        total = 0
        for node in self.live():
            for line in httpx.get(node.url + "/metrics", timeout=10).text.splitlines():
                if line.startswith("nekomem_cluster_forwards_total{"):
                    total += int(float(line.rsplit(" ", 1)[1]))
        return total

    def writers(self, name: str) -> list[dict]:
        path = self.folder_of(name) / ".writers.ndjson"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@contextmanager
def cluster(tmp_path: Path, size: int = 3, **node_env: str) -> Iterator[Cluster]:
    """etcd, ``size`` nodes (each with ``node_env`` added to its environment) and HAProxy,
    every shard owned; all stopped on exit."""
    require_tools()
    etcd = Etcd(tmp_path)
    nodes: list[Node] = []
    proxy: HAProxy | None = None
    try:
        etcd.start()
        root = tmp_path / "memory"
        root.mkdir(exist_ok=True)  # a test may have written a root for the nodes to take over
        # Slot k = server node<k> of the shipped HAProxy config: the proxy learns owners.
        nodes = [Node(root, etcd, f"n{i}", NEKOMEM_CLUSTER_PROXY_SLOT=str(i), **node_env) for i in range(1, size + 1)]
        for node in nodes:
            node.start(timeout=120)
        proxy = HAProxy(tmp_path, nodes)
        proxy.start()
        c = Cluster(tmp_path, etcd, nodes, proxy, int(node_env.get("NEKOMEM_CLUSTER_SHARDS", SHARDS)))
        wait_for(lambda: c.settled({n.node_id for n in nodes}), timeout=SETTLE, what="every shard owned")
        yield c
    finally:
        if proxy is not None:
            proxy.stop()
        for node in nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.resume()
                node.stop()
        etcd.stop()
