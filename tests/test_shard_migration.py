"""From one node to a cluster: ``nekomem cluster shard-root`` moves a single-node memory
root into ``shards/<NNNN>/`` (real files, the real CLI as a process), a cluster node
refuses to start on a root that was not moved, and a real cluster (etcd, a node, HAProxy)
serves the moved characters' turns."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import httpx

from nekomem.cluster.migration import ShardMigrationError, move_into_shards
from nekomem.stores.layout import list_characters
from nekomem.stores.shard_layout import character_root
from tests.support.cluster import SHARDS, cluster
from tests.support.live import ROOT, LiveServer, make_settings
from tests.support.waiting import wait_for

NAMES = ["Lan", "ミク", "shards"]  # "shards" is the cluster layout's own folder name


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NEKOMEM_CLUSTER_SHARDS": str(SHARDS), **(env or {})}
    return subprocess.run([sys.executable, "-m", "nekomem", *args], env=full, capture_output=True, text=True, timeout=120)


def _files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its relative path, with its content's hash."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".nkatmp")
    }


def _single_node_root(root: Path) -> dict[str, dict[str, str]]:
    """A memory root written by a real single-node server: two turns per character. The
    files of each character folder, after the server stopped."""
    with LiveServer(make_settings(root)) as srv:
        for name in NAMES:
            for text in (f"{name} likes plums", f"{name} walked by the river"):
                r = srv.post(f"/cache/{name}", json={"input_history": [{"role": "user", "content": text}]})
                assert r.status_code == 200, r.text
    return {name: _files(root / name) for name in NAMES}


def test_a_moved_root_is_served_by_a_cluster_and_an_unmoved_one_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    before = _single_node_root(root)

    # Cluster mode on the unmoved root: refused before anything starts (no etcd needed).
    refused = _cli("serve", "--memory-root", str(root), "--port", "0", env={"NEKOMEM_CLUSTER_ETCD_URL": "http://127.0.0.1:9"})
    assert refused.returncode == 2, refused.stderr
    assert "3 character(s) in the single-node layout" in refused.stderr and "cluster shard-root" in refused.stderr

    # While a server holds the root, the move is refused and moves nothing.
    with LiveServer(make_settings(root)):
        busy = _cli("cluster", "shard-root", "--memory-root", str(root))
    assert busy.returncode == 2 and "nothing was moved" in busy.stderr, busy.stderr
    assert list_characters(root) == sorted(NAMES)
    before = {name: _files(root / name) for name in NAMES}  # that server opened the databases too

    dry = _cli("cluster", "shard-root", "--memory-root", str(root), "--dry-run")
    assert dry.returncode == 0 and "3 character(s)" in dry.stdout and "would move" in dry.stdout, dry.stdout + dry.stderr
    assert list_characters(root) == sorted(NAMES)

    moved = _cli("cluster", "shard-root", "--memory-root", str(root))
    assert moved.returncode == 0 and "moved 3 character(s)" in moved.stdout, moved.stdout + moved.stderr
    assert list_characters(root) == []
    for name in NAMES:  # every file, byte for byte, in its shard's folder
        assert _files(character_root(root, name, SHARDS) / name) == before[name], name
    again = _cli("cluster", "shard-root", "--memory-root", str(root))
    assert again.returncode == 0 and "moved 0 character(s)" in again.stdout

    with cluster(tmp_path, size=1) as c, httpx.Client(base_url=c.proxy.url, timeout=30) as client:
        for name in NAMES:
            # HAProxy may still count the unused slots of its config as up for a moment (503).
            history = wait_for(lambda n=name: (r := client.get(f"/get_recent_history/{n}")).status_code == 200 and r, what=f"{name} served")
            assert f"{name} walked by the river" in history.text and f"{name} likes plums" in history.text, name


def test_a_character_in_both_layouts_stops_the_move_before_anything_moves(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    _single_node_root(root)
    # A copy of Lan in the cluster layout too (a half-done hand move): the user must choose.
    twin = character_root(root, "Lan", SHARDS) / "Lan"
    twin.mkdir(parents=True)
    (twin / "recent.json").write_text("[]", encoding="utf-8")
    try:
        move_into_shards(root, SHARDS)
    except ShardMigrationError as exc:
        assert "Lan" in str(exc) and "both layouts" in str(exc)
    else:
        raise AssertionError("the move went ahead with two copies of Lan")
    assert list_characters(root) == sorted(NAMES)  # nothing moved, "shards" included


def test_a_move_stopped_after_parking_the_shards_character_is_finished_by_the_next(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    before = _single_node_root(root)
    # As if an earlier run had parked "shards", made the shards folder, then stopped.
    os.rename(root / "shards", root / ".nkatmp-shards-character")
    (root / "shards").mkdir()
    moves = move_into_shards(root, SHARDS)
    assert sorted(m.name for m in moves) == sorted(NAMES)
    assert not (root / ".nkatmp-shards-character").exists()
    for name in NAMES:
        assert _files(character_root(root, name, SHARDS) / name) == before[name], name
