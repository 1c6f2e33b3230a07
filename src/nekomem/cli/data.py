"""``nekomem delete``, ``backup``, ``restore``, ``export`` and ``import``: a person's memory
data from the command line (README, "Backup, export and restore" and "Forgetting").

With a server running on the memory root, ``delete``, ``backup`` and ``export`` go through
it (``--url``, default ``$NEKOMEM_URL`` or the serve settings' address; ``--token``
default ``$NEKOMEM_API_TOKEN``): an erasure must reach the actors that hold copies in
memory, and a copy is taken under the server's hold of one character at a time
(``POST /api/characters/{name}/export``), so it is consistent while other characters keep
taking writes. With no server, they work on the folder itself under the memory root's
exclusive lock (a server cannot start meanwhile). ``restore`` and ``import`` write into a
memory root no server is using (with one running they refuse and print the command to run
once it is stopped): they read and check every character of the source first, then write
them all or none, each built beside its target and renamed into place
(:mod:`nekomem.stores.snapshot_check`, :mod:`nekomem.stores.snapshot_write`;
docs/OPERATIONS.md, "Backup and restore").
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import shutil
import sqlite3
import sys
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import httpx
import msgspec

from nekomem.config import Settings
from nekomem.domain.layers import ForgetFlag, layers
from nekomem.layers.recall import persist as recall_persist
from nekomem.recall.entry import display_tz
from nekomem.stores import knowledge_backup as kb
from nekomem.stores import rootlock
from nekomem.stores.atomic import atomic_write_bytes
from nekomem.stores.knowledge import KnowledgeFileError, KnowledgeFiles
from nekomem.stores.layout import CORE_CONFIG_FILE, CharacterPaths, InvalidName, known_entries, list_characters, validate_name
from nekomem.stores.shard_layout import SHARDS_DIR, character_root
from nekomem.stores.snapshot import read_character, read_regular
from nekomem.stores.snapshot_check import SnapshotError, check_character
from nekomem.stores.snapshot_write import occupied, write_characters

COMMANDS = ("delete", "backup", "restore", "export", "import")
EXPORT_FORMAT = "nekomem-export"
EXPORT_VERSION = 1


def forget_flags() -> dict[str, ForgetFlag]:
    """Layer address -> its ``nekomem delete --<flag> ID``, as the declarations say."""
    return {spec.address: spec.forget for spec in layers() if spec.forget is not None}


def _holder(exc: rootlock.RootLocked) -> str:
    """`` (serve pid 1234)``: who holds the root, as its lock file says, or nothing."""
    holder: object = exc.holder
    if not holder:
        return ""
    describe = getattr(holder, "describe", None)  # a structured holder names pid, role and port itself
    return f" ({describe() if callable(describe) else holder})"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


class CommandError(Exception):
    """A refusal to print (exit status 2) or a failure (exit status 1)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def add_parsers(sub: Any) -> None:
    """Register the subcommands on ``sub`` (the parser's subparsers)."""

    def server_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--url", help="the running server (default $NEKOMEM_URL, else the serve settings' host and port)")
        p.add_argument("--token", help="the server's API token (default $NEKOMEM_API_TOKEN)")
        p.add_argument("--memory-root", help="data folder (default: the serve settings)")
        p.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
        p.add_argument("--offline", action="store_true", help="work on the folder even if a server answers at --url")

    d = sub.add_parser("delete", help="delete a character, or forget one of its memories (through the running server)")
    d.add_argument("name", help="the character")
    for flag in forget_flags().values():
        d.add_argument(f"--{flag.flag}", metavar="ID", help=f"forget this {flag.what} only")
    d.add_argument("--turn", metavar="ROW", help="forget these stored turns only (row ids, comma-separated)")
    d.add_argument("--from", dest="start", metavar="TIME", help="forget the stored turns from this ISO 8601 time (with --to)")
    d.add_argument("--to", dest="end", metavar="TIME", help="... up to this time, inclusive")
    d.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    server_options(d)
    b = sub.add_parser("backup", help="copy every character (consistently, also while the server runs) into a new memory root")
    b.add_argument("dest", help="an empty or new folder; it becomes a memory root a server can use as it is")
    b.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="only these characters")
    server_options(b)
    e = sub.add_parser("export", help="write every character into one portable JSON file (format nekomem-export)")
    e.add_argument("out", help="the file to write")
    e.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="only these characters")
    server_options(e)
    for cmd, what in (("restore", "a folder made by `nekomem backup`"), ("import", "a file made by `nekomem export`")):
        r = sub.add_parser(cmd, help=f"write the characters of {what} into the memory root (no server may be using it)")
        r.add_argument("source", help=what)
        r.add_argument("--memory-root", help="data folder to write into (default: the serve settings)")
        r.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
        r.add_argument("--character", action="extend", nargs="+", metavar="NAME", help="only these characters")
        r.add_argument("--replace", action="store_true", help="replace characters that already exist in the memory root")


def run(args: argparse.Namespace, settings: Settings, default_url: str, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run one of :data:`COMMANDS` (printing to ``out`` / ``err``, default the process's
    stdout and stderr); returns the exit status."""
    out, err = out or sys.stdout, err or sys.stderr
    root = Path(settings.server.memory_root)
    try:
        if args.command in ("restore", "import"):
            return _write_into(args, settings, root, out)
        server = None if args.offline else _Server.find(args.url or os.environ.get("NEKOMEM_URL") or default_url, args, settings)
        if args.command == "delete":
            return _delete(args, server, root, out)
        docs = _documents(server, root, args.character)
        if args.command == "backup":
            # The packs are process-wide: they go with a whole backup, not with --character.
            knowledge = None if args.character else _knowledge_copy(server, root, err)
            return _backup(Path(args.dest), docs, server is None, root, settings, out, knowledge)
        return _export(Path(args.out), docs, out)
    except CommandError as exc:
        print(f"nekomem {args.command}: {exc}", file=err)
        return exc.status
    except rootlock.RootLocked as exc:
        holder = _holder(exc)
        print(
            f"nekomem {args.command}: the memory root {exc.root} is in use by a running nekomem server{holder}: "
            "pass its --url (without --offline), or stop it",
            file=err,
        )
        return 2
    except (SnapshotError, InvalidName) as exc:
        nothing = " (nothing was written)" if args.command in ("restore", "import") and "nothing was written" not in str(exc) else ""
        print(f"nekomem {args.command}: {exc}{nothing}", file=err)
        return 2
    except KnowledgeFileError as exc:
        print(f"nekomem {args.command}: the knowledge folder of {root} cannot be read ({exc}); nothing was written", file=err)
        return 1
    except (OSError, sqlite3.Error) as exc:
        print(f"nekomem {args.command}: {type(exc).__name__}: {exc} (no existing character was changed)", file=err)
        return 1


class _Server:
    """A running server reached over HTTP."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    @classmethod
    def find(cls, url: str, args: argparse.Namespace, settings: Settings) -> _Server | None:
        token = args.token or os.environ.get("NEKOMEM_API_TOKEN") or settings.server.api_token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        client = httpx.Client(base_url=url, headers=headers, timeout=settings.server.settle_timeout_seconds)
        try:
            client.get("/health", timeout=3)
        except httpx.HTTPError:
            client.close()
            return None
        return cls(client)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON answer; a refusal becomes a CommandError with the server's message."""
        response = self.client.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                body = response.json()
                message = f"{body.get('error_code')}: {body.get('message')}"
            except ValueError:
                message = response.text[:200]
            raise CommandError(f"the server answered {response.status_code} ({message})", 2 if response.status_code < 500 else 1)
        return response.json()


@contextmanager
def _quiet_root(root: Path, role: str) -> Iterator[None]:
    """No server may write ``root`` meanwhile (raises RootLocked when one runs)."""
    with rootlock.acquire(root, "exclusive", role):
        yield


def _confirm(args: argparse.Namespace, what: str) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(f"this would {what}; pass --yes to confirm", 2)
    if input(f"This will {what}. Type the character's name to confirm: ").strip() != args.name:
        raise CommandError("not confirmed; nothing was deleted", 2)


def _delete(args: argparse.Namespace, server: _Server | None, root: Path, out: TextIO) -> int:
    name = validate_name(args.name)
    chosen = [(layer, getattr(args, flag.flag.replace("-", "_"))) for layer, flag in forget_flags().items()]
    items = [(layer, entry) for layer, entry in chosen if entry]
    turns = args.turn or args.start or args.end
    if len(items) + bool(turns) > 1:
        raise CommandError("name one thing to forget at a time", 2)
    if items or turns:
        if server is None:
            raise CommandError("forgetting one memory needs the running server (its actors hold copies in memory)", 2)
        if turns:
            params = {"ids": args.turn} if args.turn else {"from": args.start or "", "to": args.end or ""}
            what = f"rows {args.turn}" if args.turn else f"from {args.start or '?'} to {args.end or '?'}"
            _confirm(args, f"forget the stored turns of {name} ({what}) with every copy of them")
            answer = server.call("DELETE", f"/api/characters/{name}/turns", params=params)
            print(f"forgot {answer['forgotten']} stored turns of {name}", file=out)
            return 0
        layer, entry = items[0]
        _confirm(args, f"forget {layer} entry {entry} of {name}")
        server.call("DELETE", f"/api/characters/{name}/{layer}/{entry}")
        print(f"forgot {layer} entry {entry} of {name}", file=out)
        return 0
    _confirm(args, f"delete the character {name} and every memory of it")
    if server is not None:
        answer = server.call("DELETE", f"/api/characters/{name}")
        print(f"deleted {name} ({answer['files_removed']} files)", file=out)
        return 0
    with _quiet_root(root, "delete"):
        folder = CharacterPaths(root, name).home  # in a N.E.K.O. memory folder: the reference's files too
        if not folder.is_dir():
            raise CommandError(f"no character {name} in {root}", 2)
        shutil.rmtree(folder)
    print(f"deleted {name}", file=out)
    return 0


def _names(available: list[str], wanted: list[str] | None) -> list[str]:
    if not wanted:
        return available
    missing = [n for n in wanted if n not in available]
    if missing:
        raise CommandError(f"no character {', '.join(missing)}", 2)
    return [n for n in available if n in wanted]


def _documents(server: _Server | None, root: Path, wanted: list[str] | None) -> Iterator[dict[str, Any]]:
    """Each character's document, one at a time (each under its own hold). The server is
    asked for its list before this returns, so a refusal comes before anything is written."""
    if server is None:
        return _folder_documents(root, wanted)
    listed = [c["name"] for c in server.call("GET", "/api/characters")["characters"]]
    return (server.call("POST", f"/api/characters/{name}/export", json={}) for name in _names(listed, wanted))


def _folder_documents(root: Path, wanted: list[str] | None) -> Iterator[dict[str, Any]]:
    with _quiet_root(root, "backup"):
        for name in _names(list_characters(root), wanted):
            paths = CharacterPaths(root, name)
            yield read_character(paths.folder, paths.recent)


def _fresh_dest(dest: Path) -> None:
    if dest.exists() and any(p.name != rootlock.LOCK_FILE for p in dest.iterdir()):
        raise CommandError(f"{dest} is not empty: back up into a new folder", 2)
    dest.mkdir(parents=True, exist_ok=True)


def _knowledge_copy(server: _Server | None, root: Path, err: TextIO) -> kb.KnowledgeCopy | None:
    """The knowledge packs' durable state: from the running server (read under its
    knowledge lock), else from the folder under the root's lock; None when there is
    nothing to copy. A pack whose file is broken is left out, with a warning."""
    if server is not None:
        answer = server.call("POST", "/api/knowledge/export", json={})
        try:
            copy = msgspec.convert(answer["copy"], kb.KnowledgeCopy)
            broken = msgspec.convert(answer["broken"], list[str])
        except (msgspec.ValidationError, KeyError, TypeError):
            raise CommandError("the server's knowledge copy is not in the expected shape; nothing was written") from None
        kb.check_copy(copy, "the server's knowledge copy")
    else:
        with _quiet_root(root, "backup"):
            copy, broken = kb.read_copy(KnowledgeFiles(root))
    if broken:
        print(f"nekomem backup: knowledge packs left out (their file is missing or damaged): {', '.join(broken)}", file=err)
    if not copy.registry.packs and copy.registry.enabled:
        return None
    return copy


def _backup(
    dest: Path,
    docs: Iterator[dict[str, Any]],
    offline: bool,
    root: Path,
    settings: Settings,
    out: TextIO,
    knowledge: kb.KnowledgeCopy | None = None,
) -> int:
    _fresh_dest(dest)
    count = 0
    for doc in docs:
        checked = check_character(
            doc,
            where="the copy",
            max_depth=settings.importer.restore_max_depth,
            name_max_length=settings.server.name_max_length,
            name_max_units=settings.server.name_max_units,
        )
        write_characters([checked], lambda _name: dest, replace=False)
        count += 1
    if offline and os.path.lexists(root / CORE_CONFIG_FILE):
        atomic_write_bytes(dest / CORE_CONFIG_FILE, read_regular(root / CORE_CONFIG_FILE, CORE_CONFIG_FILE))
    packs = kb.install(dest, knowledge, replace=False) if knowledge is not None else []
    also = f" and {_plural(len(packs), 'knowledge pack')}" if packs else ""
    print(f"backed up {_plural(count, 'character')}{also} into {dest}", file=out)
    return 0


def _export(path: Path, docs: Iterator[dict[str, Any]], out: TextIO) -> int:
    characters = list(docs)
    document = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "characters": characters,
    }
    atomic_write_bytes(path, msgspec.json.encode(document) + b"\n")
    print(f"exported {_plural(len(characters), 'character')} into {path}", file=out)
    return 0


def read_export(path: Path) -> list[Any]:
    """The character documents of an export file (unchecked: :func:`check_character`
    checks each); raises SnapshotError for anything but an export file."""
    try:
        # The file the user named is theirs to name through a link (a "latest.json", say).
        document = msgspec.json.decode(read_regular(path.resolve(), str(path)))
    except OSError as exc:
        raise SnapshotError(f"{path} cannot be read ({exc.strerror or exc})") from None
    except RecursionError:
        raise SnapshotError(f"{path} nests too deeply to be read") from None
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise SnapshotError(f"{path} is not a {EXPORT_FORMAT} file")
    if document.get("version") != EXPORT_VERSION:
        raise SnapshotError(f"{EXPORT_FORMAT} version {str(document.get('version'))[:20]!r} is not supported")
    characters = document.get("characters")
    if not isinstance(characters, list):
        raise SnapshotError(f"{path}: 'characters' is not a list")
    return characters


def _backup_folders(source: Path, settings: Settings) -> list[Path]:
    """The character folders of a backup, none reached through a symbolic link (a linked
    one is refused: following it would copy files from outside into the memory root)."""
    folders = []
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        try:
            validate_name(entry.name, settings.server.name_max_length, settings.server.name_max_units)
        except InvalidName:
            continue
        if entry.is_symlink():
            raise SnapshotError(f"{entry.name} in {source} is a symbolic link; nekomem never makes one, so it is not restored")
        if entry.is_dir(follow_symlinks=False) and any(os.path.lexists(Path(entry.path) / known) for known in known_entries()):
            folders.append(Path(entry.path))
    return folders


def _core_config(source: Path) -> bytes | None:
    """The backup's ``core_config.json`` when it has one (a JSON object, not a link)."""
    path = source / CORE_CONFIG_FILE
    if not os.path.lexists(path):
        return None
    data = read_regular(path, f"{CORE_CONFIG_FILE} in {source}")
    try:
        value = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        raise SnapshotError(f"{CORE_CONFIG_FILE} in {source} is not valid JSON") from None
    if not isinstance(value, dict):
        raise SnapshotError(f"{CORE_CONFIG_FILE} in {source} is not a JSON object")
    return data


def _parents(root: Path, settings: Settings) -> Callable[[str], Path]:
    """Where a character's folder goes under ``root``: the root itself, or in a cluster
    root (``cluster_etcd_url`` set) its shard's folder. A root in the cluster layout
    without the cluster settings is refused: the shard count is not known."""
    if settings.cluster.cluster_etcd_url:
        return functools.partial(character_root, root, shards=settings.cluster.cluster_shards)
    shards = root / SHARDS_DIR
    if shards.is_dir() and not any(os.path.lexists(shards / known) for known in known_entries()):
        raise CommandError(
            f"{root} is a cluster memory root (its characters live under {SHARDS_DIR}/): pass the cluster's settings "
            "(--config with cluster_etcd_url and cluster_shards) so each character goes into its shard; nothing was written",
            2,
        )
    return lambda _name: root


def _rerun_command(args: argparse.Namespace, root: Path, *, replace: bool) -> str:
    words = ["nekomem", args.command, args.source, "--memory-root", args.memory_root or str(root)]
    if args.config:
        words += ["--config", args.config]
    if args.character:
        words += ["--character", *args.character]
    if replace:
        words.append("--replace")
    return shlex.join(words)


def _index_facts(settings: Settings, characters: list[tuple[Path, str]], out: TextIO) -> None:
    """Write the recall segment of each character just written (see
    :mod:`nekomem.layers.recall.persist`), so its first wake does not re-index its facts.
    A failure costs that wake the rebuild only, so it is reported and not raised."""
    if not settings.recall.recall_index_persist:
        return
    tz = display_tz(settings.server.display_timezone)
    server = settings.server
    for parent, name in characters:
        paths = CharacterPaths(parent, name, max_length=server.name_max_length, max_units=server.name_max_units)
        try:
            recall_persist.build_offline(paths, settings, paths.name, tz)
        except OSError as exc:
            print(f"{name}: the recall index was not written ({type(exc).__name__}); the first wake builds it", file=out)


def _write_into(args: argparse.Namespace, settings: Settings, root: Path, out: TextIO) -> int:
    """``restore`` and ``import``: read and check every character of the source, then
    write them all or none (:mod:`nekomem.stores.snapshot_write`)."""
    source = Path(args.source)
    imp = settings.importer
    try:
        lock = rootlock.acquire(root, "exclusive", args.command)
    except rootlock.RootLocked as exc:
        holder = _holder(exc)
        raise CommandError(
            f"the memory root {args.memory_root or root} is in use by a running nekomem server{holder}; {args.command} replaces whole character "
            f"folders, which a running server holds in memory. Stop that server, run `{_rerun_command(args, root, replace=args.replace)}`, "
            "then start the server again (nothing was written)",
            2,
        ) from None
    with lock:
        core: bytes | None = None
        knowledge: kb.KnowledgeCopy | None = None
        if args.command == "import":
            docs = read_export(source)
            label = str(source)
            wheres = [f"{label}: character {i}" for i in range(len(docs))]
        else:
            if not source.is_dir():
                raise CommandError(f"{source} is not a folder made by nekomem backup", 2)
            folders = _backup_folders(source, settings)
            docs = [read_character(f, untrusted=True, read_timeout_seconds=imp.restore_read_timeout_seconds) for f in folders]
            wheres = [str(f) for f in folders]
            core = _core_config(source)
            # The packs are process-wide: a whole restore brings them, --character does not.
            knowledge = None if args.character else kb.read_backup(source)
        checked = [
            check_character(
                doc,
                where=where,
                max_depth=imp.restore_max_depth,
                name_max_length=settings.server.name_max_length,
                name_max_units=settings.server.name_max_units,
            )
            for doc, where in zip(docs, wheres, strict=True)
        ]
        if args.character:
            wanted = {unicodedata.normalize("NFC", n.strip()) for n in args.character}
            missing = sorted(wanted - {c.name for c in checked})
            if missing:
                raise CommandError(f"no character {', '.join(missing)} in {source} (nothing was written)", 2)
            checked = [c for c in checked if c.name in wanted]
        parent_of = _parents(root, settings)
        clashes = [c.name for c in checked if occupied(parent_of(c.name) / c.name)]
        if knowledge is not None:
            present = KnowledgeFiles(root).load_registry().packs
            clashes += [f"knowledge pack {pack_id}" for pack_id in sorted(knowledge.registry.packs) if pack_id in present]
        if clashes and not args.replace:
            raise CommandError(
                f"already in {args.memory_root or root}: {', '.join(clashes)} (nothing was written). To replace them with the copy, run "
                f"`{_rerun_command(args, root, replace=True)}`: each current folder is removed only once its copy is in place",
                2,
            )
        write_characters(checked, parent_of, replace=args.replace)
        _index_facts(settings, [(parent_of(c.name), c.name) for c in checked], out)
        try:
            packs = kb.install(root, knowledge, replace=args.replace) if knowledge is not None else []
        except (OSError, KnowledgeFileError) as exc:
            raise CommandError(
                f"the characters were restored, but the knowledge packs could not be written ({type(exc).__name__}: {exc}); "
                "the packs already installed are as they were. Run the restore again with --replace once that is fixed"
            ) from None
        if core is not None and not (root / CORE_CONFIG_FILE).exists():
            atomic_write_bytes(root / CORE_CONFIG_FILE, core)
    done = "restored" if args.command == "restore" else "imported"
    names = ", ".join(c.name for c in checked)
    print(f"{done} {_plural(len(checked), 'character')} into {root}{': ' + names if names else ''}", file=out)
    if packs:
        print(f"{done} {_plural(len(packs), 'knowledge pack')} into {root}: {', '.join(packs)}", file=out)
    return 0
