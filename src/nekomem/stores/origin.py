"""``origin.json``: where a character came from, nekomem's own small per-character file.

Written once, by the first write that made the character (when, through which route,
from which kind of client), and extended by an operator's rename or merge. It holds no
memory text: a route template such as ``POST /cache/{name}`` and a client kind such as
``python-httpx`` or ``browser``, never a query, a body or a full User-Agent. The memory
browser shows it beside each character, so a character made by a mistyped name shows
where it came from. A folder older than this file has none (shown as unknown).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from nekomem.stores.atomic import atomic_write_json, read_json

ORIGIN_FILE = "origin.json"
_PRODUCT = re.compile(r"[A-Za-z0-9._-]{1,40}")
BROWSER_MARKS = ("Mozilla/", "Chrome/", "Safari/", "Firefox/")


class Renamed(msgspec.Struct, frozen=True):
    """One rename: the former name and when."""

    name: str
    at: str


class Merged(msgspec.Struct, frozen=True):
    """One merge into this character: the character merged in, when, and its own origin."""

    name: str
    at: str
    origin: CharacterOrigin | None = None


class CharacterOrigin(msgspec.Struct, frozen=True):
    """When and through what a character was created, and the operator's changes since."""

    created_at: str
    route: str  # "POST /cache/{name}", "nekomem characters merge", ...
    client: str  # a client kind (see client_kind), "" when none was sent
    renamed_from: list[Renamed] = []
    merged_from: list[Merged] = []


def client_kind(user_agent: str | None) -> str:
    """A short kind of client from a User-Agent header: ``browser`` for a web browser,
    else its first product token (``python-httpx``, ``curl``, ``nekomem-client``, ...),
    ``other`` when that token is unusual, ``""`` when there is none."""
    if not user_agent or not user_agent.strip():
        return ""
    if any(mark in user_agent for mark in BROWSER_MARKS):
        return "browser"
    product = user_agent.strip().split("/", 1)[0].split(" ", 1)[0]
    return product if _PRODUCT.fullmatch(product) else "other"


def read_origin(folder: Path) -> CharacterOrigin | None:
    """The origin stored in ``folder``; None when there is none (or it cannot be read:
    a corrupt one is moved aside by read_json). Raises OSError on other I/O failures."""
    value, status = read_json(Path(folder) / ORIGIN_FILE, type=CharacterOrigin)
    return value if status == "ok" else None


def write_origin(folder: Path, origin: CharacterOrigin) -> None:
    """Replace ``folder``'s origin (atomically). Raises OSError."""
    atomic_write_json(Path(folder) / ORIGIN_FILE, msgspec.to_builtins(origin))


def record_creation(folder: Path, origin: CharacterOrigin) -> bool:
    """Store ``origin`` unless the folder already has one (the first creation wins when two
    first writes race); True when it was stored. Raises OSError."""
    if (Path(folder) / ORIGIN_FILE).exists():
        return False
    write_origin(folder, origin)
    return True
