"""Where a character lives in cluster mode: its shard, and the shard's folder.

``shard = stable_hash(NFC(name)) mod S``: the hash is the first 8 bytes of BLAKE2b over the
UTF-8 of the NFC form, so every node, every Python version and every restart agree (the
built-in ``hash`` is salted per process). In cluster mode a character's folder is
``<memory_root>/shards/<NNNN>/<name>/``, so one shard can be a volume of its own and moves
as a whole; single-node mode keeps ``<memory_root>/<name>/`` and never reads this module.
"""

from __future__ import annotations

import hashlib
import unicodedata
from pathlib import Path

SHARDS_DIR = "shards"
SHARD_LOCK_FILE = ".shard.lock"


def shard_of(name: str, shards: int) -> int:
    """The shard of character ``name`` among ``shards`` (NFC first: a name typed in NFD
    lands where its canonical form does)."""
    canonical = unicodedata.normalize("NFC", name)
    digest = hashlib.blake2b(canonical.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def shard_label(shard: int) -> str:
    """The folder / key name of a shard: 4 digits, so up to 4,096 shards sort in order."""
    return f"{shard:04d}"


def shards_root(memory_root: Path) -> Path:
    return Path(memory_root) / SHARDS_DIR


def shard_folder(memory_root: Path, shard: int) -> Path:
    """The folder holding every character of ``shard``."""
    return shards_root(memory_root) / shard_label(shard)


def character_root(memory_root: Path, name: str, shards: int) -> Path:
    """The root under which character ``name``'s folder lives in cluster mode."""
    return shard_folder(memory_root, shard_of(name, shards))


def shard_of_path(memory_root: Path, path: Path) -> int | None:
    """The shard whose folder holds ``path``, or None when ``path`` is outside every shard."""
    try:
        rel = Path(path).relative_to(shards_root(memory_root))
    except ValueError:
        return None
    if not rel.parts:
        return None
    head = rel.parts[0]
    return int(head) if head.isdigit() else None
