"""Defaults read from a N.E.K.O. data directory (setting ``neko_data_dir``).

The reference keeps its runtime data in ``<base>/N.E.K.O/`` (``config/``, ``memory/``, ...),
where ``<base>`` is, in the order its ConfigManager tries them, the platform's application
data folder (Windows ``%LOCALAPPDATA%``, macOS ``~/Library/Application Support``, elsewhere
``$XDG_DATA_HOME`` then ``~/.local/share``), then the legacy Documents folder
(``$XDG_DOCUMENTS_DIR``, ``~/Documents``). ``NEKO_STORAGE_SELECTED_ROOT`` names the data
directory itself when the user moved it.

What nekomem takes from it, each only when the user did not set it:

- ``master_name``: ``config/characters.json`` → ``"主人"`` → ``"档案名"`` (the master's profile
  name, the one the reference's prompts use);
- ``core_config_path``: ``config/`` (its ``core_config.json`` holds the powerful-memory and
  recent-review switches the UI toggles; nekomem re-reads it on every use);
- ``context_language``: the reference keeps no language in its files; it takes
  ``NEKO_LANGUAGE``, else Steam's language, else the system locale. nekomem follows the
  same order without Steam (``NEKO_LANGUAGE``, then ``LC_ALL`` / ``LC_MESSAGES`` / ``LANG``);
- ``character_cards_path``: ``config/characters.json``, whose cards become protected
  persona entries (see :mod:`nekomem.stores.neko_cards`);
- ``memory_root``: N.E.K.O.'s own ``memory/`` folder, served in place: nekomem adopts it at
  start and keeps the reference's files there in the reference's formats, its own in each
  character's ``.nekomem/`` (see :mod:`nekomem.importer.neko_folder`, docs/NEKO-FILES.md);
  never ``./memory``, which run from a N.E.K.O. source folder is its Python package.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("nekomem.config")

APP_NAME = "N.E.K.O"
AUTO = "auto"
SELECTED_ROOT_ENV = "NEKO_STORAGE_SELECTED_ROOT"
MEMORY_FOLDER = "memory"
_STEAM_NAMES = {"schinese": "zh", "tchinese": "zh-TW", "english": "en", "japanese": "ja", "koreana": "ko", "korean": "ko"}


def candidates(env: Mapping[str, str], home: Path, platform: str = sys.platform) -> list[Path]:
    """Where the reference keeps its data directory, most preferred first."""
    found: list[Path] = []
    selected = env.get(SELECTED_ROOT_ENV, "").strip()
    if selected:
        found.append(Path(selected).expanduser())
    bases: list[Path] = []
    if platform == "win32":
        if env.get("LOCALAPPDATA", "").strip():
            bases.append(Path(env["LOCALAPPDATA"].strip()))
        bases.append(home / "Documents")
    elif platform == "darwin":
        bases += [home / "Library" / "Application Support", home / "Documents"]
    else:
        if env.get("XDG_DATA_HOME", "").strip():
            bases.append(Path(env["XDG_DATA_HOME"].strip()))
        bases.append(home / ".local" / "share")
        if env.get("XDG_DOCUMENTS_DIR", "").strip():
            bases.append(Path(env["XDG_DOCUMENTS_DIR"].strip()))
        bases.append(home / "Documents")
    found += [base / APP_NAME for base in bases]
    unique: list[Path] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def home_of(env: Mapping[str, str]) -> Path:
    """The user's home folder as the environment names it (``HOME``, else ``USERPROFILE``)."""
    return Path(env.get("HOME") or env.get("USERPROFILE") or Path.home())


def import_roots(env: Mapping[str, str], home: Path | None = None, platform: str = sys.platform) -> list[Path]:
    """The folders ``POST /api/import/neko`` reads from when the ``import_root`` setting is
    empty: every place the reference keeps (or kept) its data directory on this platform, as
    :func:`candidates` lists them (its selected root, the platform's application data folder,
    then the legacy Documents folder)."""
    return candidates(env, home if home is not None else home_of(env), platform)


def is_data_dir(path: Path) -> bool:
    """A folder laid out as the reference's data directory (it has ``config/characters.json``
    or ``config/core_config.json``)."""
    config = path / "config"
    return (config / "characters.json").is_file() or (config / "core_config.json").is_file()


def resolve(value: str, env: Mapping[str, str], home: Path | None = None) -> Path | None:
    """The data directory the ``neko_data_dir`` setting names: empty → None (off), ``auto`` →
    the first candidate laid out as one (None when there is none), else the path itself."""
    value = value.strip()
    if not value:
        return None
    if value.lower() != AUTO:
        return Path(value).expanduser()
    home = home if home is not None else home_of(env)
    for path in candidates(env, home):
        if is_data_dir(path):
            return path
    log.info("no N.E.K.O. data directory found where N.E.K.O. keeps it")
    return None


def language_from_env(env: Mapping[str, str]) -> str | None:
    """``NEKO_LANGUAGE``, else the locale variables, as a nekomem language code; None when
    none of them names a supported language."""
    for key in ("NEKO_LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        raw = env.get(key, "").strip()
        if not raw:
            continue
        code = _language_code(raw)
        if code is not None:
            return code
        if key == "NEKO_LANGUAGE":
            continue  # an invalid override falls back to detection, as in the reference
        return None  # the first locale variable set decides, as the C library does
    return None


def _language_code(raw: str) -> str | None:
    low = raw.split(".", 1)[0].split("@", 1)[0].strip().lower().replace("_", "-")
    if low in _STEAM_NAMES:
        return _STEAM_NAMES[low]
    if low.startswith("zh"):
        return "zh-TW" if any(tag in low for tag in ("tw", "hk", "mo", "hant")) else "zh"
    for code in ("en", "ja", "ko", "ru", "es", "pt"):
        if low == code or low.startswith(code + "-"):
            return code
    return None


def master_name(characters_json: Path) -> str | None:
    """The master's profile name in ``characters.json``, or None (no file, no name)."""
    data = read_characters(characters_json)
    master = data.get("主人") if data is not None else None
    name = master.get("档案名") if isinstance(master, dict) else None
    return name.strip() if isinstance(name, str) and name.strip() else None


def read_characters(path: Path) -> dict[str, Any] | None:
    """``characters.json`` decoded, or None when it is missing or not a JSON object (an
    unreadable file is logged, not fatal: the defaults stay)."""
    return read_json_object(path)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON file of N.E.K.O.'s decoded, or None when it is missing or not a JSON object
    (an unreadable file is logged with its error's class, never its content)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read: %s", path, type(exc).__name__)
        return None
    return data if isinstance(data, dict) else None


def defaults(data_dir: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """Setting values taken from the data directory (field name → value)."""
    config = data_dir / "config"
    found: dict[str, Any] = {
        "core_config_path": str(config),
        "character_cards_path": str(config / "characters.json"),
        "memory_root": str(data_dir / MEMORY_FOLDER),
    }
    name = master_name(config / "characters.json")
    if name is not None:
        found["master_name"] = name
    language = language_from_env(env)
    if language is not None:
        found["context_language"] = language
    return found
