"""Defaults from a N.E.K.O. data directory laid out as the reference lays it out.

The reference keeps ``<base>/N.E.K.O/config/characters.json`` (``"主人"``: the master's
profile, ``"猫娘"``: each character's card) and ``config/core_config.json`` (the UI's
switches); on Linux ``<base>`` is ``$XDG_DATA_HOME`` or ``~/.local/share``. With
``neko_data_dir`` (``auto`` finds it there) nekomem takes the master's name, the language
(``NEKO_LANGUAGE``, else the locale, as the reference), the powerful-memory switch and the
character cards (protected persona entries, re-synced at the next load) from it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nekomem.config import load_settings
from nekomem.config.neko_data import candidates, resolve
from tests.support.live import TEST_EMBEDDING_MODEL, LiveServer

MASTER = {"档案名": "小明", "性别": "男", "昵称": "阿明"}
CARD = {
    "昵称": "小白",
    "性格": "温柔",
    "爱好": ["晒太阳", "鱼"],
    "voice_id": "cosyvoice-xyz",  # reserved: never a persona entry
    "name": "workshop-name",  # reserved (workshop field)
    "_reserved": {"avatar": {"live2d": {"model_path": "yui/yui.model3.json"}}},
}


def lay_out(base: Path, *, powerful: bool = False) -> Path:
    data = base / "N.E.K.O"
    (data / "config").mkdir(parents=True)
    (data / "memory").mkdir()
    characters = {"主人": MASTER, "猫娘": {"小白": CARD, "Mochi": {"昵称": "Mochi"}}, "当前猫娘": "小白"}
    (data / "config" / "characters.json").write_text(json.dumps(characters, ensure_ascii=False, indent=2), encoding="utf-8")
    core = {"coreApi": "qwen", "powerful_memory_enabled": powerful, "recent_memory_auto_review": True}
    (data / "config" / "core_config.json").write_text(json.dumps(core), encoding="utf-8")
    (data / "config" / "user_preferences.json").write_text("[]", encoding="utf-8")
    return data


def settings_for(tmp_path: Path, env: dict[str, str], **overrides: object):
    values: dict[str, object] = {
        "memory_root": str(tmp_path / "nekomem"),
        "port": 0,
        "embedding_enabled": False,
        "embedding_model": TEST_EMBEDDING_MODEL,
        "gc_full_collection_seconds": 0,
        "neko_data_dir": "auto",
    }
    values.update(overrides)
    return load_settings(None, env=env, overrides=values)


def test_discovery_follows_the_references_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg")}
    assert candidates(env, home, "linux")[:2] == [tmp_path / "xdg" / "N.E.K.O", home / ".local" / "share" / "N.E.K.O"]
    assert candidates({"LOCALAPPDATA": "C:/Users/u/AppData/Local"}, home, "win32")[0] == Path("C:/Users/u/AppData/Local") / "N.E.K.O"
    assert candidates({}, home, "darwin")[0] == home / "Library" / "Application Support" / "N.E.K.O"
    assert resolve("auto", env, home) is None  # nothing laid out yet
    legacy = lay_out(home / "Documents")
    assert resolve("auto", env, home) == legacy
    standard = lay_out(home / ".local" / "share")
    assert resolve("auto", env, home) == standard  # the application data folder comes first
    moved = lay_out(tmp_path / "moved")
    assert resolve("auto", {**env, "NEKO_STORAGE_SELECTED_ROOT": str(moved)}, home) == moved
    assert resolve("", env, home) is None


def test_settings_take_master_language_switches_and_cards_from_the_data_dir(tmp_path: Path) -> None:
    home = tmp_path / "home"
    data = lay_out(home / ".local" / "share")
    s = settings_for(tmp_path, {"HOME": str(home), "LANG": "ja_JP.UTF-8"})
    assert s.server.neko_data_dir == str(data)
    assert s.recent.master_name == "小明"
    assert s.server.context_language == "ja"
    assert Path(s.server.core_config_path) == data / "config"
    assert Path(s.server.character_cards_path) == data / "config" / "characters.json"
    assert Path(s.server.memory_root) == tmp_path / "nekomem"  # set explicitly: kept
    # Unset, the memory root is N.E.K.O.'s own memory folder, served in place (docs/NEKO-FILES.md).
    unset = load_settings(None, env={"HOME": str(home)}, overrides={"neko_data_dir": "auto"})
    assert Path(unset.server.memory_root) == data / "memory"
    # NEKO_LANGUAGE wins over the locale, as in the reference; a setting you made wins over both.
    assert settings_for(tmp_path, {"HOME": str(home), "LANG": "ja_JP.UTF-8", "NEKO_LANGUAGE": "zh-TW"}).server.context_language == "zh-TW"
    assert settings_for(tmp_path, {"HOME": str(home), "NEKOMEM_MASTER_NAME": "Boss"}).recent.master_name == "Boss"
    assert settings_for(tmp_path, {"HOME": str(home), "LANG": "C.UTF-8"}).server.context_language == "en"
    # Without a data directory nothing changes.
    plain = settings_for(tmp_path, {"HOME": str(tmp_path / "empty")})
    assert plain.recent.master_name == "Master" and plain.server.core_config_path == "" and plain.server.character_cards_path == ""


def persona(srv: LiveServer, name: str) -> list[dict]:
    return srv.get(f"/api/characters/{name}/persona", params={"limit": 100}).json()["items"]


def test_a_server_on_the_data_dir_uses_its_master_switch_language_and_cards(tmp_path: Path) -> None:
    home = tmp_path / "home"
    data = lay_out(home / ".local" / "share", powerful=False)
    settings = settings_for(tmp_path, {"HOME": str(home), "LANG": "zh_CN.UTF-8"})
    with LiveServer(settings) as srv:
        # The UI's powerful-memory switch, read from the data directory's core_config.json.
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": False}
        history = {"input_history": [{"role": "user", "content": "今天好热"}, {"role": "assistant", "content": "要喝水哦"}]}
        assert srv.post("/cache/小白", json=history).status_code == 200
        context = srv.get("/new_dialog/小白").text
        assert "小明 | 今天好热" in context  # the master's profile name, not "Master"
        assert context == srv.get("/new_dialog/小白", params={"language": "zh"}).text  # Chinese by default
        assert context != srv.get("/new_dialog/小白", params={"language": "en"}).text

        items = persona(srv, "小白")
        cards = [i for i in items if i["source"] == "character_card"]
        texts = [i["text"] for i in cards]
        assert "昵称: 小白" in texts and "性格: 温柔" in texts and "爱好: 晒太阳、鱼" in texts
        assert "档案名: 小明" in texts  # the master's profile, in the master section
        assert all(i["protected"] for i in cards)
        assert not any("cosyvoice" in t or "workshop-name" in t or "yui" in t for t in texts)
        assert "性格: 温柔" in context  # protected entries are rendered

        # The user edits the card in the chat server; its /reload makes nekomem read it again.
        characters = json.loads((data / "config" / "characters.json").read_text(encoding="utf-8"))
        characters["猫娘"]["小白"]["性格"] = "活泼"
        del characters["猫娘"]["小白"]["爱好"]
        (data / "config" / "characters.json").write_text(json.dumps(characters, ensure_ascii=False), encoding="utf-8")
        assert srv.post("/reload").json()["status"] == "success"
        texts = [i["text"] for i in persona(srv, "小白") if i["source"] == "character_card"]
        assert "性格: 活泼" in texts and "性格: 温柔" not in texts
        assert not any(t.startswith("爱好") for t in texts)

        # The UI turns powerful memory on in its own file: nekomem follows at once.
        core = json.loads((data / "config" / "core_config.json").read_text())
        core["powerful_memory_enabled"] = True
        (data / "config" / "core_config.json").write_text(json.dumps(core))
        assert srv.get("/api/memory/powerful_memory_config").json() == {"enabled": True}


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]"])
def test_an_unreadable_cards_file_keeps_the_entries_and_serves(tmp_path: Path, content: bytes) -> None:
    home = tmp_path / "home"
    data = lay_out(home / ".local" / "share")
    settings = settings_for(tmp_path, {"HOME": str(home)})
    with LiveServer(settings) as srv:
        assert srv.post("/cache/小白", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        before = [i["text"] for i in persona(srv, "小白") if i["source"] == "character_card"]
        assert "性格: 温柔" in before
        (data / "config" / "characters.json").write_bytes(content)
        assert srv.post("/reload").json()["status"] == "success"
        after = [i["text"] for i in persona(srv, "小白") if i["source"] == "character_card"]
        assert after == before  # nothing dropped for a file that cannot be read
        assert (data / "config" / "characters.json").read_bytes() == content  # the chat server's file is untouched
