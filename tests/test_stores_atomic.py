"""Atomic writes, tolerant JSON reads, temp sweeping and the cursors file."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgspec
import pytest

from nekomem.stores import atomic
from nekomem.stores.atomic import (
    SWAP_PREFIX,
    atomic_write_bytes,
    atomic_write_json,
    drop_swap,
    encode_json,
    read_json,
    swap_write_bytes,
    sweep_temp_files,
)
from nekomem.stores.cursors import Cursors


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".nkatmp"))


class Sample(msgspec.Struct):
    name: str
    count: int = 0


# -- atomic writes ---------------------------------------------------------------------


def test_write_bytes_replaces_content_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "file.bin"
    atomic_write_bytes(target, b"old")
    atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert _temps(target.parent) == []


@pytest.mark.skipif(os.name == "nt", reason="POSIX permission bits")
def test_written_file_is_private(tmp_path: Path) -> None:
    target = tmp_path / "private.json"
    atomic_write_json(target, {"a": 1})
    assert target.stat().st_mode & 0o777 == 0o600


def test_failed_write_removes_temp_and_keeps_old_content(tmp_path: Path) -> None:
    target = tmp_path / "file.json"
    atomic_write_bytes(target, b"old")
    with pytest.raises(TypeError):
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert _temps(tmp_path) == []


def test_failed_rename_removes_temp(tmp_path: Path) -> None:
    occupied = tmp_path / "is_a_folder"
    occupied.mkdir()
    (occupied / "inside").write_text("x")
    with pytest.raises(OSError):
        atomic_write_bytes(occupied, b"data")
    assert (occupied / "inside").read_text() == "x"
    assert _temps(tmp_path) == []


def test_unencodable_json_touches_nothing(tmp_path: Path) -> None:
    target = tmp_path / "file.json"
    atomic_write_json(target, {"ok": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert _temps(tmp_path) == []


def test_json_is_compact_utf8_and_handles_structs(tmp_path: Path) -> None:
    target = tmp_path / "view.json"
    atomic_write_json(target, {"items": [Sample(name="ねこ", count=2)]})
    text = target.read_text(encoding="utf-8")
    assert "ねこ" in text  # not \\u-escaped
    assert text == '{"items":[{"name":"ねこ","count":2}]}\n'  # compact: depth costs no bytes
    assert text.endswith("\n")
    value, status = read_json(target, type=dict[str, list[Sample]])
    assert status == "ok"
    assert value == {"items": [Sample(name="ねこ", count=2)]}
    assert encode_json([]) == b"[]\n"


def test_a_view_nested_beyond_every_decoder_reads_as_corrupt(tmp_path: Path) -> None:
    target = tmp_path / "facts.json"
    target.write_bytes(b"[" * 50_000 + b"]" * 50_000)
    assert read_json(target, default=[]) == ([], "corrupt")
    assert not target.exists() and list(tmp_path.glob("facts.json.corrupt-*"))


# -- reads -------------------------------------------------------------------------------


def test_read_missing_returns_default(tmp_path: Path) -> None:
    assert read_json(tmp_path / "nope.json", default={"d": 1}) == ({"d": 1}, "missing")


def test_corrupt_file_is_moved_aside_with_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "facts.json"
    target.write_bytes(b'{"half": ')
    with caplog.at_level(logging.WARNING, logger="nekomem.stores.atomic"):
        value, status = read_json(target, default=[])
    assert (value, status) == ([], "corrupt")
    assert not target.exists()
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("facts.json.corrupt-")]
    assert len(aside) == 1
    assert aside[0].read_bytes() == b'{"half": '
    assert any("corrupt" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    # the next read sees a missing file, not the corrupt one again
    assert read_json(target, default=[]) == ([], "missing")


def test_schema_mismatch_counts_as_corrupt_and_repeats_get_distinct_names(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    for _ in range(2):
        target.write_text('{"name": 5}')
        assert read_json(target, type=Sample, default=None) == (None, "corrupt")
    aside = sorted(p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name)
    assert len(aside) == 2 and aside[0] != aside[1]


def test_empty_file_is_corrupt(tmp_path: Path) -> None:
    target = tmp_path / "recent.json"
    target.write_bytes(b"")
    assert read_json(target, default=[]) == ([], "corrupt")


# -- temp sweep ---------------------------------------------------------------------------


def test_sweep_removes_only_old_owned_temp_files(tmp_path: Path) -> None:
    now = time.time()
    old = tmp_path / ".nkatmp0123abcd.tmp"
    fresh = tmp_path / ".nkatmp89abcdef.tmp"
    foreign = tmp_path / ".nkatmpXYZ.tmp"
    folder_named_like_temp = tmp_path / ".nkatmpaaaaaaaa.tmp"
    for path in (old, fresh, foreign):
        path.write_bytes(b"x")
    folder_named_like_temp.mkdir()
    for path in (old, foreign, folder_named_like_temp):
        os.utime(path, (now - 2 * 86400, now - 2 * 86400))
    assert sweep_temp_files(tmp_path, 86400, now=now) == 1
    assert not old.exists()
    assert fresh.exists() and foreign.exists() and folder_named_like_temp.is_dir()
    assert sweep_temp_files(tmp_path / "missing", 0) == 0


# -- crash safety ------------------------------------------------------------------------

_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from nekomem.stores.atomic import atomic_write_json
    target = Path(sys.argv[1])
    n = 0
    while True:
        size = 20000 + (n * 7919) % 300000
        atomic_write_json(target, {"n": n, "size": size, "data": "x" * size})
        print(n, flush=True)
        n += 1
    """
)


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL")
@pytest.mark.parametrize("writes_before_kill", [1, 3, 8, 21, 55])
def test_sigkill_during_writes_leaves_a_complete_file(tmp_path: Path, writes_before_kill: int) -> None:
    target = tmp_path / "view.json"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        last = -1
        assert child.stdout is not None
        for _ in range(writes_before_kill):
            line = child.stdout.readline()
            assert line, "writer died early"
            last = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    value = json.loads(target.read_text())
    assert value["n"] >= last  # a write that returned is there
    assert len(value["data"]) == value["size"]  # and the file is whole, never torn
    assert len(_temps(tmp_path)) <= 1  # at most the one in flight when killed
    leftovers = len(_temps(tmp_path))
    assert sweep_temp_files(tmp_path, 0, now=time.time() + 1) == leftovers
    assert _temps(tmp_path) == []


# -- cursors -----------------------------------------------------------------------------


def test_cursors_merge_persist_and_validate(tmp_path: Path) -> None:
    path = tmp_path / "cursors.json"
    cursors = Cursors(path)
    assert cursors.get("rebuttal_checked_until") is None
    cursors.set("rebuttal_checked_until", "2024-05-01T10:00:00+00:00")
    cursors.set("extracted_until", "2024-05-02T10:00:00+09:00")
    with pytest.raises(ValueError):
        cursors.set("extracted_until", "yesterday")
    reopened = Cursors(path)
    assert reopened.all() == {
        "rebuttal_checked_until": "2024-05-01T10:00:00+00:00",
        "extracted_until": "2024-05-02T10:00:00+09:00",
    }


def test_cursors_drop_invalid_values_and_survive_corruption(tmp_path: Path) -> None:
    path = tmp_path / "cursors.json"
    path.write_text('{"good": "2024-01-01T00:00:00+00:00", "bad": "soon", "worse": 5}')
    assert Cursors(path).all() == {"good": "2024-01-01T00:00:00+00:00"}
    path.write_text("{not json")
    cursors = Cursors(path)
    assert cursors.all() == {}
    cursors.set("good", "2024-01-02T00:00:00+00:00")
    assert json.loads(path.read_text()) == {"good": "2024-01-02T00:00:00+00:00"}


def test_swap_write_replaces_whole_and_reports_the_new_file(tmp_path: Path) -> None:
    """Each write leaves the path with exactly the new bytes and returns that file's stat;
    where the exchange works, the view alternates between two inodes (none created or
    freed per write) and the swap file holds the previous content until dropped."""
    path = tmp_path / "recent.json"
    inodes = set()
    previous = None
    for i in range(6):
        data = (b'[{"n": %d}]' % i) * (1 + 50 * (i % 3))  # grows and shrinks
        written = swap_write_bytes(path, data)
        assert path.read_bytes() == data
        st = os.stat(path)
        assert (written.st_ino, written.st_size, written.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
        inodes.add(st.st_ino)
        swap = tmp_path / (SWAP_PREFIX + "recent.json")
        if atomic._renameat2 is not None and previous is not None:
            assert swap.read_bytes() == previous
        previous = data
    if atomic._renameat2 is not None:
        assert len(inodes) == 2
    drop_swap(path)
    drop_swap(path)  # nothing left to drop: no error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recent.json"]


def test_swap_write_falls_back_to_a_rename_without_exchange(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(atomic, "_renameat2", None)
    path = tmp_path / "recent.json"
    swap_write_bytes(path, b"[1]")
    swap_write_bytes(path, b"[2]")
    assert path.read_bytes() == b"[2]" and sorted(p.name for p in tmp_path.iterdir()) == ["recent.json"]
