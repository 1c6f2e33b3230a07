"""Issue 28, item 6: a memory root on a real case-insensitive, case-preserving file system
(a FUSE mount of tests/support/casefold_fs.py, which matches names as NTFS does): every
spelling of a name is one character, across a restart; fullwidth look-alikes stay apart."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nekomem.stores.namefold import CharacterSpellings, fold, probe_case_insensitive
from tests.support.live import ROOT, LiveServer, make_settings
from tests.support.waiting import wait_for

# Twelve facts that share no words (the duplicate check keeps them all).
FACTS = [
    "Master collects antique brass telescopes",
    "Master's sister breeds Siamese kittens",
    "Master grows chili peppers on balconies",
    "Master practises kendo every Thursday evening",
    "Master dislikes loud motorcycles",
    "Master learned Portuguese while travelling",
    "Master repairs vintage typewriters",
    "Master's grandmother bakes walnut bread",
    "Master swims across lakes during summer",
    "Master writes haiku about trains",
    "Master is afraid of deep caves",
    "Master's favourite colour happens to be teal",
]


def _turn(text: str) -> dict:
    return {"input_history": [{"role": "user", "content": text}]}


@pytest.fixture
def folding_fs(tmp_path: Path) -> Iterator[Path]:
    """A mounted case-folding file system (skipped where FUSE cannot run)."""
    pytest.importorskip("fuse", reason="fusepy is not installed")
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount") is None and shutil.which("fusermount3") is None:
        pytest.skip("FUSE is not available here (/dev/fuse, fusermount)")
    backing, point = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    point.mkdir()
    log = open(tmp_path / "fuse.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.casefold_fs", str(backing), str(point)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"},
        stdout=log,
        stderr=log,
    )
    log.close()
    try:
        wait_for(lambda: os.path.ismount(point) or proc.poll() is not None, timeout=30, what="the FUSE mount")
        if not os.path.ismount(point):
            pytest.skip("the FUSE mount did not come up: " + (tmp_path / "fuse.log").read_text(errors="replace")[-500:])
        yield point
    finally:
        unmount = shutil.which("fusermount") or shutil.which("fusermount3") or "fusermount"
        subprocess.run([unmount, "-u", str(point)], capture_output=True)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_the_mount_folds_case(folding_fs: Path) -> None:
    (folding_fs / "Probe").write_text("x")
    assert (folding_fs / "PROBE").read_text() == "x"
    assert os.listdir(folding_fs) == ["Probe"]  # case preserving
    assert probe_case_insensitive(folding_fs) is True
    assert os.listdir(folding_fs) == ["Probe"]  # the probe file is removed


def test_every_spelling_is_one_character_across_a_restart(folding_fs: Path) -> None:
    root = folding_fs / "memory"
    spellings = ["Neko", "neko", "NEKO", "nEkO"]
    with LiveServer(make_settings(root)) as srv:
        assert srv.get("/health").json()["case_insensitive_root"] is True
        for i, name in enumerate(spellings * 3):
            assert srv.post(f"/cache/{name}", json=_turn(f"turn {i} as {name}")).status_code == 200
            facts = srv.post(f"/api/characters/{name}/facts", json={"facts": [{"text": FACTS[i]}]})
            assert facts.status_code == 200, facts.text
        assert srv.runtime.registry.active_names() == ["Neko"]
        recent = [i["text"] for i in srv.get("/api/characters/NEKO/recent").json()["items"]]
        assert len(recent) == 12
        total = srv.get("/api/characters/neko/facts").json()["total"]
        assert total == 12
        assert [c["name"] if isinstance(c, dict) else c for c in srv.get("/api/characters").json()["characters"]] == ["Neko"]
    assert [p.name for p in root.iterdir() if p.is_dir()] == ["Neko"]
    with LiveServer(make_settings(root)) as srv:
        assert srv.get("/api/characters/neko/facts").json()["total"] == total
        assert len(srv.get("/api/characters/NEKO/recent").json()["items"]) == 12
        # Nothing was moved aside as corrupt.
        assert not [p for p in (root / "Neko").iterdir() if "corrupt" in p.name]


def test_fullwidth_look_alikes_are_characters_of_their_own(folding_fs: Path) -> None:
    root = folding_fs / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.post("/cache/Lan", json=_turn("ascii")).status_code == 200
        assert srv.post("/cache/ｌａｎ", json=_turn("fullwidth lower")).status_code == 200
        assert srv.post("/cache/ＬＡＮ", json=_turn("fullwidth upper")).status_code == 200
        assert sorted(srv.runtime.registry.active_names()) == sorted(["Lan", "ｌａｎ"])
        assert [i["text"] for i in srv.get("/api/characters/ＬＡＮ/recent").json()["items"]] == ["fullwidth lower", "fullwidth upper"]
        assert [i["text"] for i in srv.get("/api/characters/lan/recent").json()["items"]] == ["ascii"]


def test_a_case_sensitive_root_keeps_every_name_apart(tmp_path: Path) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.get("/health").json()["case_insensitive_root"] is False
        srv.post("/cache/Neko", json=_turn("one"))
        srv.post("/cache/neko", json=_turn("two"))
        assert sorted(srv.runtime.registry.active_names()) == ["Neko", "neko"]


def test_fold_follows_the_disks_simple_case_mapping(tmp_path: Path) -> None:
    assert fold("Neko") == fold("NEKO") == fold("neko")
    assert fold("ｌａｎ") == fold("ＬＡＮ") != fold("Lan")
    assert fold("Straße") != fold("STRASSE")  # no full folding: NTFS keeps ß
    assert fold("cafe\u0301") == fold("CAFÉ")  # NFD and NFC alike
    (tmp_path / "Mochi").mkdir()
    names = CharacterSpellings(tmp_path, insensitive=True)
    assert names.canonical("MOCHI") == "Mochi"
    assert names.canonical("Fresh") == "Fresh" and names.canonical("FRESH") == "Fresh"
    assert CharacterSpellings(tmp_path, insensitive=False).canonical("MOCHI") == "MOCHI"
