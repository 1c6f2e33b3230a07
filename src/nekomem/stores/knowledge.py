"""The files of the public knowledge packs: one process-wide folder at the memory root.

``<memory_root>/.nekomem-knowledge/`` (:data:`KNOWLEDGE_DIR`; reserved as a character
name by :mod:`nekomem.stores.layout`, and skipped by the N.E.K.O. folder adopter like
every ``.nekomem*`` entry) holds:

- ``registry.json``: the global switch and one record per installed pack (its version
  digest, source, counts and the user's choices: automatic context, local vectors, the
  material-type override, the disabled titles). With the pack files it is the source of
  truth; the index is rebuilt from them at every start;
- ``packs/pack-<id>.<sha16>.json``: the normalized pack, as imported;
- ``jobs.json``: the import jobs (state, progress, reason; never pack text);
- ``staging/<job_id>.json``: the pack of a job that has not finished.

Every write is atomic (:mod:`nekomem.stores.atomic`). One owner
(:class:`nekomem.runtime.knowledge.KnowledgeService`) calls this, under its lock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from nekomem.domain.knowledge_pack import PackSource
from nekomem.stores.atomic import atomic_write_bytes, encode_json
from nekomem.stores.layout import KNOWLEDGE_DIR
from nekomem.stores.private import private_folder

log = logging.getLogger(__name__)

REGISTRY_FILE = "registry.json"
JOBS_FILE = "jobs.json"
PACKS_DIR = "packs"
STAGING_DIR = "staging"
REGISTRY_VERSION = 1


class KnowledgeFileError(Exception):
    """``registry.json`` or ``jobs.json`` exists but cannot be read as written."""


class PackRecord(msgspec.Struct, kw_only=True):
    pack_id: str
    pack_sha256: str
    source: PackSource
    declared_material_type: str
    entries: int
    material_type_override: str | None = None
    auto_context: bool = False
    local_embedding: bool = True
    disabled_titles: list[str] = msgspec.field(default_factory=list)
    installed_at: str = ""
    updated_at: str = ""

    @property
    def effective_material_type(self) -> str:
        return self.material_type_override or self.declared_material_type

    @property
    def file_name(self) -> str:
        # Prefixed so that an id such as ``con`` never names a Windows device.
        return f"pack-{self.pack_id}.{self.pack_sha256[:16]}.json"


class Registry(msgspec.Struct, kw_only=True):
    schema_version: int = REGISTRY_VERSION
    enabled: bool = True
    packs: dict[str, PackRecord] = msgspec.field(default_factory=dict)


class Job(msgspec.Struct, kw_only=True):
    """One import: queued -> building -> active | failed | cancelled."""

    job_id: str
    pack_id: str
    state: str
    created_at: str
    updated_at: str
    reason: str = ""
    entries_total: int = 0
    entries_indexed: int = 0
    chunks_total: int = 0
    cancel_requested: bool = False


class JobsFile(msgspec.Struct):
    jobs: list[Job] = msgspec.field(default_factory=list)


class KnowledgeFiles:
    """Reads and writes the knowledge folder of one memory root."""

    def __init__(self, memory_root: Path) -> None:
        self.folder = Path(memory_root) / KNOWLEDGE_DIR

    def _make(self) -> None:
        # Pack text is as private as memory: folders 0700, as the characters' (stores.private).
        for folder in (self.folder, self.folder / PACKS_DIR, self.folder / STAGING_DIR):
            private_folder(folder)

    # -- registry ------------------------------------------------------------------

    def load_registry(self) -> Registry:
        """The registry; an empty one when the file is missing. Raises KnowledgeFileError."""
        path = self.folder / REGISTRY_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return Registry()
        try:
            registry = msgspec.json.decode(raw, type=Registry)
        except msgspec.DecodeError as exc:
            raise KnowledgeFileError(f"registry.json: {exc}") from None
        if registry.schema_version != REGISTRY_VERSION:
            raise KnowledgeFileError("registry.json: unsupported schema_version")
        return registry

    def save_registry(self, registry: Registry) -> None:
        if registry == Registry() and not self.folder.exists():
            return  # nothing to keep: the folder appears with the first pack or setting
        self._make()
        atomic_write_bytes(self.folder / REGISTRY_FILE, encode_json(msgspec.to_builtins(registry)))

    # -- jobs ----------------------------------------------------------------------

    def load_jobs(self) -> list[Job]:
        """The recorded jobs (newest last); [] when the file is missing. Raises KnowledgeFileError."""
        try:
            raw = (self.folder / JOBS_FILE).read_bytes()
        except FileNotFoundError:
            return []
        try:
            return msgspec.json.decode(raw, type=JobsFile).jobs
        except msgspec.DecodeError as exc:
            raise KnowledgeFileError(f"jobs.json: {exc}") from None

    def save_jobs(self, jobs: list[Job]) -> None:
        # No folder until there is something to keep: a root without packs stays as it was
        # (in a N.E.K.O. memory folder the main process lists every folder of the root).
        if not jobs and not self.folder.exists():
            return
        self._make()
        atomic_write_bytes(self.folder / JOBS_FILE, encode_json(msgspec.to_builtins(JobsFile(jobs))))

    # -- pack files ----------------------------------------------------------------

    def read_pack(self, record: PackRecord) -> bytes:
        """The stored bytes of a pack version; raises OSError."""
        return (self.folder / PACKS_DIR / record.file_name).read_bytes()

    def write_pack(self, record: PackRecord, raw: bytes) -> None:
        self._make()
        atomic_write_bytes(self.folder / PACKS_DIR / record.file_name, raw)

    def delete_pack(self, record: PackRecord) -> None:
        (self.folder / PACKS_DIR / record.file_name).unlink(missing_ok=True)

    def stage(self, job_id: str, raw: bytes) -> None:
        self._make()
        atomic_write_bytes(self.folder / STAGING_DIR / f"{job_id}.json", raw)

    def read_staged(self, job_id: str) -> bytes | None:
        try:
            return (self.folder / STAGING_DIR / f"{job_id}.json").read_bytes()
        except FileNotFoundError:
            return None

    def drop_staged(self, job_id: str) -> None:
        (self.folder / STAGING_DIR / f"{job_id}.json").unlink(missing_ok=True)

    def clean_leftovers(self, referenced: set[str], staged: set[str]) -> int:
        """Delete pack files no record names and staged files no unfinished job owns
        (a crash between two writes leaves them); returns how many went."""
        removed = 0
        for sub, keep in ((PACKS_DIR, referenced), (STAGING_DIR, {f"{j}.json" for j in staged})):
            try:
                entries = list(os.scandir(self.folder / sub))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.is_file() and entry.name not in keep:
                    try:
                        os.unlink(entry.path)
                        removed += 1
                    except OSError:
                        log.warning("could not delete a leftover knowledge file")
        return removed
