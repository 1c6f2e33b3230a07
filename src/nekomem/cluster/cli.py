"""``nekomem cluster status`` and ``nekomem cluster drain``: operations on a running
cluster through any of its nodes (``--url``, default: the configured server).
``nekomem cluster shard-root``: the offline move of a single-node memory root into the
cluster layout (:mod:`nekomem.cluster.migration`), before the first node starts on it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, TextIO

import httpx

from nekomem.cluster import migration as shard_migration
from nekomem.config import Settings
from nekomem.stores import rootlock


def add_parser(sub: Any) -> None:
    """Register ``nekomem cluster ...`` on the CLI's subparsers."""
    cluster = sub.add_parser("cluster", help="cluster mode: status of the nodes and shards, drain a node")
    cluster.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
    actions = cluster.add_subparsers(dest="cluster_command", required=True)
    status = actions.add_parser("status", help="live nodes, shards per node, moving shards")
    status.add_argument("--url", help="any node (default: the configured host and port)")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    drain = actions.add_parser("drain", help="move every shard off a node (--undo gives it shards again)")
    drain.add_argument("node", help="the node id")
    drain.add_argument("--url", help="any node (default: the configured host and port)")
    drain.add_argument("--undo", action="store_true", help="end the drain")
    drain.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the node's shards to move (0: do not wait)")
    shard = actions.add_parser(
        "shard-root",
        help="move a single-node memory root's characters into cluster mode's shards/<NNNN>/ folders (every server stopped)",
    )
    shard.add_argument("--memory-root", help="data folder (default: the serve settings)")
    shard.add_argument("--dry-run", action="store_true", help="say how many characters would move, move nothing")


def shard_root(settings: Settings, dry_run: bool, out: TextIO, err: TextIO) -> int:
    """Move the configured memory root into the cluster layout for ``cluster_shards``; the
    exit code (2: refused, nothing moved; 1: an I/O error part-way, run it again)."""
    root = Path(settings.server.memory_root)
    shards = settings.cluster.cluster_shards
    max_length = settings.server.name_max_length
    try:
        if dry_run:
            moves = shard_migration.plan(root, shards, max_length=max_length)
            print(f"{len(moves)} character(s) of {root} would move into {len({m.shard for m in moves})} of {shards} shards", file=out)
            return 0
        moves = shard_migration.move_into_shards(root, shards, max_length=max_length)
    except (rootlock.RootLocked, shard_migration.ShardMigrationError) as exc:
        print(f"nekomem cluster shard-root: {exc}; nothing was moved", file=err)
        return 2
    except OSError as exc:
        print(f"nekomem cluster shard-root: {exc}; the characters moved so far stay moved, run it again for the rest", file=err)
        return 1
    print(f"moved {len(moves)} character(s) of {root} into {len({m.shard for m in moves})} of {shards} shards", file=out)
    return 0


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def run(args: argparse.Namespace, url: str, token: str, out: TextIO, err: TextIO) -> int:
    """Run a cluster subcommand against the node at ``url``; the exit code."""
    url = (args.url or url).rstrip("/")
    try:
        with httpx.Client(base_url=url, headers=_headers(token), timeout=30) as client:
            if args.cluster_command == "status":
                return _status(client, args.json, out, err)
            return _drain(client, args.node, args.undo, args.wait, out, err)
    except httpx.HTTPError as exc:
        print(f"nekomem cluster: {url} unreachable: {type(exc).__name__}", file=err)
        return 1


def _fetch_status(client: httpx.Client) -> dict[str, Any] | None:
    r = client.get("/cluster/status")
    if r.status_code != 200:
        return None
    answer: dict[str, Any] = r.json()
    return answer


def _status(client: httpx.Client, raw: bool, out: TextIO, err: TextIO) -> int:
    answer = _fetch_status(client)
    if answer is None:
        print("nekomem cluster: /cluster/status refused (is cluster mode on?)", file=err)
        return 1
    if raw:
        print(json.dumps(answer, indent=2), file=out)
        return 0
    for node_id, view in sorted(answer["nodes"].items()):
        if "error" in view:
            print(f"{node_id}: unreachable ({view['error']})", file=out)
            continue
        moving = ",".join(str(s) for s in view["moving"]) or "-"
        drained = " (draining)" if node_id in view.get("draining", []) else ""
        print(f"{node_id}{drained}: {view['shards_owned']} shards, moving: {moving}", file=out)
    return 0


def _drain(client: httpx.Client, node: str, undo: bool, wait: float, out: TextIO, err: TextIO) -> int:
    r = client.post("/cluster/drain", json={"node": node, "undo": undo})
    if r.status_code != 200:
        print(f"nekomem cluster: drain refused: {r.status_code} {r.text[:200]}", file=err)
        return 1
    if undo or wait <= 0:
        print(f"{node}: {'drain ended' if undo else 'draining'}", file=out)
        return 0
    end = time.monotonic() + wait
    while time.monotonic() < end:
        answer = _fetch_status(client)
        view = (answer or {}).get("nodes", {}).get(node, {})
        if answer is not None and "error" not in view and view.get("shards_owned") == 0 and not view.get("moving"):
            print(f"{node}: drained (0 shards)", file=out)
            return 0
        time.sleep(0.2)
    print(f"nekomem cluster: {node} still owns shards after {wait:.0f}s", file=err)
    return 1
