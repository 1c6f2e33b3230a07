"""The knowledge packs' share of ``nekomem backup`` / ``restore``: the durable state of
``<memory_root>/.nekomem-knowledge/`` (``registry.json`` and the pack files it names),
copied out and checked back in.

Only that durable state travels. ``jobs.json`` and ``staging/`` (imports not finished)
stay behind: a restored root has no job in flight, and a pack whose import had not
finished is imported again after the restore (docs/BACKUP.md).

:func:`read_copy` reads a live folder (the service calls it under its lock; offline the
CLI under the root's lock). :func:`read_backup` reads a backup folder it does not trust:
no symbolic link followed, regular files only, every pack checked against its digest and
the pack schema (:mod:`nekomem.domain.knowledge_pack`) before anything is written.
:func:`install` writes a checked copy into a memory root: the pack files first, then the
registry (the one rename that makes them installed), so a failure midway leaves the
registry as it was and the server's start-up cleaning removes the unnamed pack files.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import msgspec

from nekomem.domain import knowledge_pack as kp
from nekomem.stores.knowledge import PACKS_DIR, REGISTRY_FILE, REGISTRY_VERSION, KnowledgeFileError, KnowledgeFiles, PackRecord, Registry
from nekomem.stores.layout import KNOWLEDGE_DIR
from nekomem.stores.snapshot import read_regular
from nekomem.stores.snapshot_check import SnapshotError

_SHA_RE = re.compile(r"[0-9a-f]{64}")


class KnowledgeCopy(msgspec.Struct, kw_only=True):
    """The registry and the bytes of every pack it names (as text: packs are UTF-8 JSON)."""

    registry: Registry
    packs: dict[str, str] = msgspec.field(default_factory=dict)  # pack_id -> pack file text


class PackClash(Exception):
    """Packs of the copy are already installed in the target (``ids``), and no replace."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(", ".join(ids))
        self.ids = ids


def read_copy(files: KnowledgeFiles) -> tuple[KnowledgeCopy, list[str]]:
    """The durable state of a live knowledge folder, and the ids of the packs left out
    because their file is missing or no longer matches its digest (the service serves
    them as ``broken`` too). Call it where nothing writes the folder meanwhile (the
    service's lock, or the root's). Raises KnowledgeFileError, OSError."""
    registry = files.load_registry()
    packs: dict[str, str] = {}
    broken: list[str] = []
    for pack_id, record in sorted(registry.packs.items()):
        try:
            raw = files.read_pack(record)
        except FileNotFoundError:
            raw = b""
        if kp.sha256_hex(raw) != record.pack_sha256:
            broken.append(pack_id)
            continue
        packs[pack_id] = raw.decode("utf-8")
    kept = {k: v for k, v in registry.packs.items() if k in packs}
    return KnowledgeCopy(registry=msgspec.structs.replace(registry, packs=kept), packs=packs), broken


def _plain_folder(path: Path, what: str) -> bool:
    """Whether ``path`` is a folder (False when absent); a link or a file is refused."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(mode):
        raise SnapshotError(f"{what} is a symbolic link; nekomem never makes one, so it is not restored")
    if not stat.S_ISDIR(mode):
        raise SnapshotError(f"{what} is not a folder")
    return True


def check_copy(copy: KnowledgeCopy, where: str) -> KnowledgeCopy:
    """``copy`` when every record is sound and its pack passes the pack schema with the
    digest and the count the record says; raises SnapshotError naming the first fault."""
    registry = copy.registry
    if registry.schema_version != REGISTRY_VERSION:
        raise SnapshotError(f"{where}: {REGISTRY_FILE} has an unsupported schema_version")
    total = 0
    for pack_id, record in registry.packs.items():
        what = f"{where}: pack {pack_id[:64]!r}"
        if record.pack_id != pack_id or not kp.pack_id_valid(pack_id) or not _SHA_RE.fullmatch(record.pack_sha256):
            raise SnapshotError(f"{what} has an invalid id or digest in {REGISTRY_FILE}")
        if record.declared_material_type not in kp.MATERIAL_TYPES or record.material_type_override not in (None, *kp.MATERIAL_TYPES):
            raise SnapshotError(f"{what} has an invalid material type in {REGISTRY_FILE}")
        text = copy.packs.get(pack_id)
        if text is None:
            raise SnapshotError(f"{what} has no pack file")
        raw = text.encode("utf-8", "surrogatepass")
        if kp.sha256_hex(raw) != record.pack_sha256:
            raise SnapshotError(f"{what}: the pack file does not match its digest")
        try:
            pack = kp.decode_pack(raw)
        except kp.PackError as exc:
            raise SnapshotError(f"{what} is not a valid pack ({exc.reason})") from None
        if pack.pack_id != pack_id or len(pack.entries) != record.entries:
            raise SnapshotError(f"{what}: the pack file does not match its record")
        total += record.entries
    if total > kp.MAX_TOTAL_ENTRIES:
        raise SnapshotError(f"{where}: more than {kp.MAX_TOTAL_ENTRIES} knowledge entries")
    extra = sorted(set(copy.packs) - set(registry.packs))
    if extra:
        raise SnapshotError(f"{where}: pack {extra[0][:64]!r} is named by no record")
    return copy


def read_backup(source: Path) -> KnowledgeCopy | None:
    """The checked knowledge copy of the backup folder ``source``, or None when it has
    none. Raises SnapshotError (a link, a non-regular file, a bad registry or pack),
    OSError."""
    folder = source / KNOWLEDGE_DIR
    if not _plain_folder(folder, f"{KNOWLEDGE_DIR} in {source}"):
        return None
    where = str(folder)
    if not os.path.lexists(folder / REGISTRY_FILE):
        raise SnapshotError(f"{where} has no {REGISTRY_FILE}")
    try:
        registry = msgspec.json.decode(read_regular(folder / REGISTRY_FILE, f"{REGISTRY_FILE} in {where}"), type=Registry)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise SnapshotError(f"{REGISTRY_FILE} in {where} cannot be read: {exc}") from None
    packs: dict[str, str] = {}
    if registry.packs:
        _plain_folder(folder / PACKS_DIR, f"{PACKS_DIR} in {where}")
    for pack_id, record in registry.packs.items():
        if not kp.pack_id_valid(pack_id) or not _SHA_RE.fullmatch(record.pack_sha256):
            raise SnapshotError(f"{where}: pack {pack_id[:64]!r} has an invalid id or digest in {REGISTRY_FILE}")
        path = folder / PACKS_DIR / record.file_name
        if not os.path.lexists(path):
            raise SnapshotError(f"{where}: pack {pack_id!r} has no pack file ({PACKS_DIR}/{record.file_name})")
        raw = read_regular(path, f"{PACKS_DIR}/{record.file_name} in {where}")
        try:
            packs[pack_id] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise SnapshotError(f"{where}: pack {pack_id!r} is not UTF-8") from None
    return check_copy(KnowledgeCopy(registry=registry, packs=packs), where)


def install(root: Path, copy: KnowledgeCopy, *, replace: bool) -> list[str]:
    """Write the packs of a checked ``copy`` into ``root``'s knowledge folder, beside the
    packs already there; returns their ids. A pack already installed is replaced only with
    ``replace`` (else PackClash, nothing written). The target's global switch is kept when
    it has a registry. Raises PackClash, KnowledgeFileError, SnapshotError, OSError."""
    files = KnowledgeFiles(root)
    had_registry = os.path.lexists(files.folder / REGISTRY_FILE)
    current = files.load_registry()
    clashes = sorted(set(copy.registry.packs) & set(current.packs))
    if clashes and not replace:
        raise PackClash(clashes)
    merged = {**current.packs, **copy.registry.packs}
    if sum(r.entries for r in merged.values()) > kp.MAX_TOTAL_ENTRIES:
        raise SnapshotError(f"with the packs already in {root}, more than {kp.MAX_TOTAL_ENTRIES} knowledge entries")
    for pack_id, record in copy.registry.packs.items():
        files.write_pack(record, copy.packs[pack_id].encode("utf-8"))
    enabled = current.enabled if had_registry else copy.registry.enabled
    files.save_registry(Registry(enabled=enabled, packs=merged))
    for pack_id in clashes:  # the replaced versions, once the registry names the new ones
        old: PackRecord = current.packs[pack_id]
        if old.file_name != copy.registry.packs[pack_id].file_name:
            files.delete_pack(old)
    return sorted(copy.registry.packs)


__all__ = ["KnowledgeCopy", "KnowledgeFileError", "PackClash", "check_copy", "install", "read_backup", "read_copy"]
