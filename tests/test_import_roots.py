"""The default import root of ``POST /api/import/neko``: every place N.E.K.O. keeps its data
directory on each platform (issue 37, item 5), as docs/NEKO.md documents them."""

from __future__ import annotations

from pathlib import Path

import pytest

from nekomem.config import neko_data
from tests.support import neko_fixture
from tests.support.live import LiveServer, make_settings

_NEKO_ENV = ("XDG_DATA_HOME", "XDG_DOCUMENTS_DIR", "NEKO_STORAGE_SELECTED_ROOT", "LOCALAPPDATA", "APPDATA", "USERPROFILE")


def test_linux_defaults_are_the_data_home_then_documents(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert neko_data.import_roots({"HOME": str(home)}, platform="linux") == [
        home / ".local" / "share" / "N.E.K.O",
        home / "Documents" / "N.E.K.O",
    ]
    env = {"HOME": str(home), "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_DOCUMENTS_DIR": str(tmp_path / "docs")}
    assert neko_data.import_roots(env, platform="linux") == [
        tmp_path / "data" / "N.E.K.O",
        home / ".local" / "share" / "N.E.K.O",
        tmp_path / "docs" / "N.E.K.O",
        home / "Documents" / "N.E.K.O",
    ]


def test_macos_defaults_are_application_support_then_documents(tmp_path: Path) -> None:
    home = tmp_path / "Users" / "me"
    assert neko_data.import_roots({"HOME": str(home)}, platform="darwin") == [
        home / "Library" / "Application Support" / "N.E.K.O",
        home / "Documents" / "N.E.K.O",
    ]


def test_windows_defaults_are_local_app_data_then_documents(tmp_path: Path) -> None:
    profile = tmp_path / "Users" / "me"
    env = {"USERPROFILE": str(profile), "LOCALAPPDATA": str(profile / "AppData" / "Local")}
    assert neko_data.import_roots(env, platform="win32") == [
        profile / "AppData" / "Local" / "N.E.K.O",
        profile / "Documents" / "N.E.K.O",
    ]


def test_a_moved_data_directory_comes_first(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path / "home"), "NEKO_STORAGE_SELECTED_ROOT": str(tmp_path / "elsewhere")}
    assert neko_data.import_roots(env, platform="linux")[0] == tmp_path / "elsewhere"


@pytest.mark.parametrize("where", ["data-home", "xdg-data-home", "documents"])
def test_the_route_imports_from_each_linux_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The README's case: a current Linux install keeps its memory in ~/.local/share/N.E.K.O."""
    home = tmp_path / "home"
    for name in _NEKO_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    data_dir = {
        "data-home": home / ".local" / "share" / "N.E.K.O",
        "xdg-data-home": tmp_path / "xdg" / "N.E.K.O",
        "documents": home / "Documents" / "N.E.K.O",
    }[where]
    if where == "xdg-data-home":
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    fixture = neko_fixture.build(data_dir / "memory")
    with LiveServer(make_settings(tmp_path / "nekomem-root")) as server:
        answer = server.post("/api/import/neko", json={"source_dir": str(fixture.root)})
        assert answer.status_code == 200, answer.text
        assert answer.json()["added_total"] > 0
        # a sibling of the data directory stays outside
        outside = server.post("/api/import/neko", json={"source_dir": str(data_dir.parent / "other")})
        assert outside.status_code == 403 and outside.json()["error_code"] == "outside_import_root"
