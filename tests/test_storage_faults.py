"""Issue 10, faults 6 and 7 over real HTTP on a real small file system (a tmpfs of a few
MB): a full disk and a read-only disk answer 507 / 503 with Retry-After, acknowledge
nothing that is not stored, mark no character failed, and recover without a restart."""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from nekomem.stores.faults import classify
from tests.support.live import LiveServer, make_settings
from tests.support.scrape import one, scrape
from tests.support.waiting import wait_for


def _mount(point: Path, size: str) -> bool:
    point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_fs(tmp_path):
    point = tmp_path / "fs"
    if os.geteuid() != 0 or not _mount(point, "4m"):
        pytest.skip("mounting a tmpfs needs root and a kernel that allows it here")
    try:
        yield point
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(point)], capture_output=True)
        subprocess.run(["umount", "-l", str(point)], check=True)


def fill(point: Path) -> Path:
    """Write a filler file until the file system is full; return it."""
    filler = point / "filler.bin"
    block = b"\0" * 65536
    # Unbuffered: a short last write leaves nothing behind in a buffer for the close to
    # fail on (the free space is not always a multiple of the block).
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(block)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler  # tmpfs allocates whole pages: the file system is now completely full


def turn(text: str) -> dict:
    return {"input_history": [{"role": "user", "content": text}]}


def recent_texts(srv, name="Lan"):
    return [i["text"] for i in srv.get(f"/api/characters/{name}/recent").json()["items"]]


def check_fault(r, status, code):
    assert r.status_code == status, r.text
    assert r.json()["error_code"] == code
    assert int(r.headers["retry-after"]) > 0


def test_disk_full_then_freed_recovers_without_restart(small_fs):
    root = small_fs / "memory"
    with LiveServer(make_settings(root, restart_budget=2)) as srv:
        assert srv.post("/cache/Lan", json=turn("before the disk filled")).status_code == 200
        fill(small_fs)
        for i in range(6):  # more attempts than the restart budget
            check_fault(srv.post("/cache/Lan", json=turn(f"lost {i}")), 507, "storage_full")
            r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": f"Master has {i} cats"}]})
            check_fault(r, 507, "storage_full")
        check_fault(srv.post("/api/memory/powerful_memory_config", json={"enabled": False}), 507, "storage_full")
        # A new character fails fast with the same answer (no folder can be created).
        check_fault(srv.post("/cache/Newcomer", json=turn("hello")), 507, "storage_full")
        health = srv.get("/health").json()
        assert health["storage"]["state"] == "storage_full"
        assert health["supervision"]["failed_children"] == 0
        # /metrics counts them by code and where they were met: a layer, or a route
        # writing outside the actors (the switch).
        _text, samples = scrape(srv)
        met = {labels["where"] for labels, _ in samples["nekomem_storage_errors_total"] if labels["code"] == "storage_full"}
        assert {"recent", "facts", "http"} <= met, met
        assert one(samples, "nekomem_storage_errors_total", code="storage_full", where="http") == 1
        assert one(samples, "nekomem_storage_faulted_layers") >= 2
        # Nothing unacknowledged was stored; reads keep working.
        assert recent_texts(srv) == ["before the disk filled"]
        assert srv.get("/api/characters/Lan/facts").json()["total"] == 0

        for p in small_fs.glob("filler*.bin"):
            p.unlink()
        assert srv.post("/cache/Lan", json=turn("after the disk was freed")).status_code == 200
        assert srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master has two cats"}]}).status_code == 200
        assert srv.post("/cache/Newcomer", json=turn("hello")).status_code == 200
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).json()["success"] is True
        assert recent_texts(srv) == ["before the disk filled", "after the disk was freed"]
        wait_for(lambda: srv.get("/health").json()["storage"]["state"] == "ok", what="storage ok in /health")
        health = srv.get("/health").json()
        assert health["storage"]["faults"] == [] and health["supervision"]["failed_children"] == 0
    # And it is all on disk.
    with LiveServer(make_settings(root)) as srv:
        assert recent_texts(srv) == ["before the disk filled", "after the disk was freed"]
        assert srv.get("/api/characters/Lan/facts").json()["total"] == 1


def test_read_only_then_writable_recovers_without_restart(tmp_path):
    # The character's folder is its own small file system: the memory root holds the
    # server's lock file open for writing, which a read-only remount would refuse.
    root = tmp_path / "memory"
    folder = root / "Lan"
    if os.geteuid() != 0 or not _mount(folder, "4m"):
        pytest.skip("mounting a tmpfs needs root and a kernel that allows it here")
    try:
        with LiveServer(make_settings(root, restart_budget=2)) as srv:
            assert srv.post("/cache/Lan", json=turn("while writable")).status_code == 200
            # The character passivates (its files closed) so that the kernel lets the
            # file system become read-only; it activates again on the next request.
            srv.runtime.registry.stop_all()
            remount = subprocess.run(["mount", "-o", "remount,ro", str(folder)], capture_output=True)
            if remount.returncode != 0:
                pytest.skip(f"cannot remount read-only: {remount.stderr!r}")
            for i in range(6):  # more attempts than the restart budget
                check_fault(srv.post("/cache/Lan", json=turn(f"lost {i}")), 503, "storage_read_only")
            assert srv.get("/health").json()["storage"]["state"] == "storage_read_only"
            # Activated on a read-only disk, the character cannot open its time index
            # (SQLite opens it for writing): its reads fail fast too, with the same answer.
            check_fault(srv.get("/api/characters/Lan/recent"), 503, "storage_read_only")

            subprocess.run(["mount", "-o", "remount,rw", str(folder)], check=True)
            assert srv.post("/cache/Lan", json=turn("writable again")).status_code == 200
            assert recent_texts(srv) == ["while writable", "writable again"]
            assert srv.get("/health").json()["supervision"]["failed_children"] == 0
            wait_for(lambda: srv.get("/health").json()["storage"]["state"] == "ok", what="storage ok in /health")
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(folder)], capture_output=True)
        subprocess.run(["umount", "-l", str(folder)], check=True)


@pytest.mark.parametrize(
    "exc,code",
    [
        (OSError(errno.ENOSPC, "full"), "storage_full"),
        (OSError(errno.EDQUOT, "quota"), "storage_full"),
        (OSError(errno.EROFS, "ro"), "storage_read_only"),
        (PermissionError(errno.EACCES, "denied"), "storage_read_only"),
        (OSError(errno.EIO, "io"), "storage_io_error"),
        (sqlite3.OperationalError("database or disk is full"), "storage_full"),
        (sqlite3.OperationalError("attempt to write a readonly database"), "storage_read_only"),
        (sqlite3.OperationalError("disk I/O error"), "storage_io_error"),
        (OSError(errno.ENOENT, "missing"), None),
        (ValueError("not storage"), None),
        (sqlite3.IntegrityError("UNIQUE constraint failed"), None),
    ],
)
def test_classify_storage_errors(exc, code):
    fault = classify(exc)
    assert (fault.code if fault else None) == code
    # Wrapped (raise ... from exc) the same fault is found.
    try:
        try:
            raise exc
        except Exception as inner:
            raise RuntimeError("wrapper") from inner
    except RuntimeError as outer:
        wrapped = classify(outer)
    assert (wrapped.code if wrapped else None) == code


def test_a_real_sqlite_full_error_is_classified(small_fs):
    fill_db = small_fs / "t.db"
    db = sqlite3.connect(fill_db)
    db.execute("CREATE TABLE t (x BLOB)")
    with pytest.raises(sqlite3.Error) as caught:
        while True:
            db.execute("INSERT INTO t VALUES (?)", (b"\0" * 65536,))
            db.commit()
    db.close()
    assert classify(caught.value).code == "storage_full"


def test_a_sound_journal_met_on_a_full_disk_is_not_taken_for_damaged(small_fs):
    # A journal closed cleanly has no -shm left; the first connection after that needs room
    # for one, and on a full disk SQLite's first read fails (SQLITE_IOERR_SHMSIZE). That is
    # the disk's fault, not the file's: the check raises the classified fault and leaves
    # the journal where it is.
    from nekomem.stores import timeindex_check
    from nekomem.stores.faults import StorageError

    path = small_fs / "time_indexed.db"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE time_indexed_original (id INTEGER PRIMARY KEY, session_id TEXT, message TEXT, timestamp TEXT)")
    db.executemany(
        "INSERT INTO time_indexed_original (session_id, message, timestamp) VALUES ('s', ?, NULL)", [(f"m{i}",) for i in range(5)]
    )
    db.commit()
    db.close()
    assert not Path(f"{path}-shm").exists()
    filler = fill(small_fs)
    with pytest.raises(StorageError) as caught:
        timeindex_check.check_journal(path, 5)
    assert caught.value.fault.code == "storage_full"  # SQLITE_IOERR_SHMSIZE on a full disk
    assert path.exists() and timeindex_check.damaged_copies(small_fs) == []
    filler.unlink()
    assert timeindex_check.check_journal(path, 5) is None
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM time_indexed_original").fetchone() == (5,)
    db.close()


def test_a_layer_that_could_not_load_on_a_full_disk_loads_by_itself_once_it_is_freed(small_fs):
    root = small_fs / "memory"
    settings = make_settings(root, storage_reload_retry_seconds=0.2, storage_reload_retry_max_seconds=0.5)
    with LiveServer(settings) as srv:
        assert srv.post("/cache/Lan", json=turn("before the disk filled")).status_code == 200
    # Stopped cleanly: the journal's -wal and -shm are gone, so its next open needs room,
    # and the disk is full before the server starts (its start-up opens the journal).
    assert not (root / "Lan" / "time_indexed.db-shm").exists()
    filler = fill(small_fs)
    with LiveServer(settings) as srv:
        answer = srv.post("/cache/Lan", json=turn("lost"))
        assert answer.status_code == 507 and answer.json()["error_code"] == "storage_full", answer.text
        faults = srv.get("/health").json()["storage"]["faults"]
        assert {"character": "Lan", "layer": "recent"} in [{k: f[k] for k in ("character", "layer")} for f in faults], faults
        filler.unlink()
        # No request to Lan: the layer's own retry loads it, and /health clears.
        wait_for(lambda: srv.get("/health").json()["storage"]["faults"] == [], what="the recent layer loaded again by itself")
        health = srv.get("/health").json()["storage"]
        assert health["damaged_journals"] == [] and health["state"] == "ok", health
        assert recent_texts(srv) == ["before the disk filled"]
    assert not [n for n in os.listdir(root / "Lan") if ".damaged-" in n]
