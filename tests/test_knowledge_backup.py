"""``nekomem backup`` / ``restore`` carry the public knowledge packs (issue 34, "backup
rules apply as for memory"): a pack imported over HTTP is backed up while the server runs
(and offline), restored into a fresh root where a server answers it; a crafted backup (a
linked pack file or folder, an invalid pack) is refused with nothing written; a restored
pack, once removed, leaves no byte of its text."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import LiveServer, make_settings
from tests.support.restore_probe import fingerprint, nekomem
from tests.test_backup import run_cli
from tests.test_knowledge import K, ask, holders, pack, post_pack, ready, titles, wait_job

KDIR = ".nekomem-knowledge"
SECRET = [{"title": "Zorblax QX7", "summary": "Vemtrik summary", "content": "Plonquist harbour ledger 88421."}]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A root with a character and two packs (one entry disabled), backed up through the
    real CLI while its server runs, then offline once it is stopped."""
    tmp = tmp_path_factory.mktemp("kb")
    root = tmp / "memory"
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hello there"}]}).status_code == 200
        assert wait_job(srv, post_pack(srv, pack())["job_id"])["state"] == "active"
        assert wait_job(srv, post_pack(srv, pack("secret-pack", SECRET))["job_id"])["state"] == "active"
        body = {"pack_id": "world-notes", "title": "Shinkansen", "disabled": True}
        assert srv.post(f"{K}/entry/disabled", json=body).json()["ok"] is True
        status, said = run_cli("backup", str(tmp / "online"), "--url", srv.url)
        assert status == 0 and "backed up 1 character and 2 knowledge packs" in said, said
        # The copy is one a GET cannot take (a POST with a JSON body, as the character export).
        assert srv.get("/api/knowledge/export").status_code == 405
        plain = srv.post("/api/knowledge/export", content=b"{}", headers={"content-type": "text/plain"})
        assert plain.status_code == 415 and plain.json()["error_code"] == "unsupported_media_type"
    done = nekomem("backup", str(tmp / "offline"), "--memory-root", str(root), "--offline")
    assert done.returncode == 0 and "and 2 knowledge packs" in done.stdout, done.stderr
    return {"root": root, "online": tmp / "online", "offline": tmp / "offline"}


def test_the_backup_holds_the_registry_and_the_packs_privately(made: dict[str, Path]) -> None:
    for which in ("online", "offline"):
        folder = made[which] / KDIR
        # No jobs and nothing staged: an import in flight is not part of a backup.
        assert sorted(p.name for p in folder.iterdir()) == ["packs", "registry.json", "staging"], which
        assert list((folder / "staging").iterdir()) == []
        live = sorted((made["root"] / KDIR / "packs").iterdir())
        copied = sorted((folder / "packs").iterdir())
        assert [p.name for p in copied] == [p.name for p in live] and len(copied) == 2
        assert [p.read_bytes() for p in copied] == [p.read_bytes() for p in live], which
        for path in [folder, folder / "packs"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        for path in [folder / "registry.json", *copied]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_a_restored_root_serves_the_packs(made: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "restored"
    status, said = run_cli("restore", str(made["online"]), "--memory-root", str(target))
    assert status == 0 and "restored 2 knowledge packs" in said and "secret-pack, world-notes" in said, said
    assert stat.S_IMODE((target / KDIR).stat().st_mode) == 0o700
    with LiveServer(make_settings(target)) as srv:
        ready(srv)
        assert srv.get(f"{K}/availability").json() == {"ok": True, "ready": True, "enabled": True, "tool_available": True}
        en = ask(srv, "what is a kotatsu?", language="en")
        assert en["result"] == "matched" and titles(en)[0] == "Kotatsu"
        assert titles(ask(srv, "兰州拉面有什么特点？", language="zh"))[0] == "兰州拉面"
        assert "Shinkansen" not in titles(ask(srv, "Shinkansen high-speed railway"))  # the user's choice came along
        assert srv.get("/api/characters/Lan/recent").status_code == 200
        # Removing a restored pack leaves no byte of its text.
        assert holders(target, "Plonquist")
        assert srv.post(f"{K}/packs/remove", json={"pack_id": "secret-pack"}).json()["ok"] is True
        for needle in ("Plonquist", "Vemtrik", "Zorblax", "88421"):
            assert holders(target, needle) == [], needle
        assert ask(srv, "Plonquist harbour")["result"] == "miss"


def test_a_pack_already_installed_needs_replace(made: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "memory"
    with LiveServer(make_settings(target)) as srv:
        ready(srv)
        newer = [{"title": "Onsen", "content": "An onsen is a hot spring."}]
        assert wait_job(srv, post_pack(srv, pack("world-notes", newer))["job_id"])["state"] == "active"

    def data() -> dict[str, str]:  # the lock file records its last holder
        return {k: v for k, v in fingerprint(target).items() if k != ".nekomem.lock"}

    before = data()
    status, said = run_cli("restore", str(made["offline"]), "--memory-root", str(target))
    assert status == 2 and "knowledge pack world-notes" in said and "--replace" in said and "Traceback" not in said, said
    assert data() == before
    status, said = run_cli("restore", str(made["offline"]), "--memory-root", str(target), "--replace")
    assert status == 0, said
    assert holders(target, "hot spring") == []  # the replaced version's file is gone
    with LiveServer(make_settings(target)) as srv:
        ready(srv)
        assert titles(ask(srv, "kotatsu heated table"))[0] == "Kotatsu"
        assert ask(srv, "hot spring onsen")["result"] == "miss"


def _relink(backup: Path, outside: Path) -> None:
    """Replace the backup's first pack file by a link to an identical file outside it."""
    path = sorted((backup / KDIR / "packs").iterdir())[0]
    shutil.copyfile(path, outside)
    path.unlink()
    path.symlink_to(outside)


def _link_folder(backup: Path, outside: Path, name: str) -> None:
    folder = backup / KDIR if name == KDIR else backup / KDIR / name
    shutil.copytree(folder, outside)
    shutil.rmtree(folder)
    folder.symlink_to(outside, target_is_directory=True)


def _invalid_pack(backup: Path, _outside: Path) -> None:
    """A pack that fails the pack schema, with a registry record that matches it."""
    folder = backup / KDIR
    registry = json.loads((folder / "registry.json").read_text(encoding="utf-8"))
    record = registry["packs"]["world-notes"]
    old = folder / "packs" / f"pack-world-notes.{record['pack_sha256'][:16]}.json"
    payload: dict[str, Any] = json.loads(old.read_text(encoding="utf-8"))
    payload["entries"].append(dict(payload["entries"][0]))  # a duplicate title
    raw = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    sha = hashlib.sha256(raw).hexdigest()
    old.unlink()
    (folder / "packs" / f"pack-world-notes.{sha[:16]}.json").write_bytes(raw)
    record.update(pack_sha256=sha, entries=len(payload["entries"]))
    (folder / "registry.json").write_text(json.dumps(registry), encoding="utf-8")


@pytest.mark.parametrize(
    ("craft", "said"),
    [
        (_relink, "symbolic link"),
        (lambda b, o: _link_folder(b, o, "packs"), "symbolic link"),
        (lambda b, o: _link_folder(b, o, KDIR), "symbolic link"),
        (_invalid_pack, "duplicate_title"),
        (lambda b, _o: (b / KDIR / "registry.json").write_text('{"packs": 3}', encoding="utf-8"), "registry.json"),
    ],
    ids=["linked-pack-file", "linked-packs-folder", "linked-knowledge-folder", "invalid-pack", "bad-registry"],
)
def test_a_crafted_backup_is_refused_with_nothing_written(made: dict[str, Path], tmp_path: Path, craft: Any, said: str) -> None:
    backup = tmp_path / "backup"
    shutil.copytree(made["online"], backup, symlinks=True)
    craft(backup, tmp_path / "outside")
    target = tmp_path / "memory"
    done = nekomem("restore", str(backup), "--memory-root", str(target))
    assert done.returncode == 2 and said in done.stderr and "nothing was written" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (target / KDIR).exists() and not (target / "Lan").exists()
    assert not os.path.lexists(target / KDIR)


def test_a_backup_of_one_character_leaves_the_packs(made: dict[str, Path], tmp_path: Path) -> None:
    done = nekomem("backup", str(tmp_path / "lan"), "--memory-root", str(made["root"]), "--offline", "--character", "Lan")
    assert done.returncode == 0 and "knowledge" not in done.stdout, done.stderr
    assert not (tmp_path / "lan" / KDIR).exists() and (tmp_path / "lan" / "Lan").is_dir()
