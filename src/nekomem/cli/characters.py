"""``nekomem characters rename OLD NEW`` and ``nekomem characters merge FROM INTO``: repair
a character made by a mistyped name, keeping every layer (see
:mod:`nekomem.stores.character_moves`).

As ``nekomem delete``: with a server running on the memory root, through it
(``POST /api/characters/{name}/rename`` / ``merge``, which hold the characters while
their folders change); with none (or ``--offline``), on the folders under the memory
root's exclusive lock (a server cannot start meanwhile).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from nekomem.cli.data import CommandError, _quiet_root, _Server
from nekomem.config import Settings
from nekomem.stores import rootlock
from nekomem.stores.character_moves import MoveError, merge_characters, rename_character
from nekomem.stores.layout import InvalidName, validate_name

COMMAND = "characters"


def add_parser(sub: Any) -> None:
    """Register ``characters rename`` and ``characters merge`` on ``sub``."""
    chars = sub.add_parser(COMMAND, help="rename a character, or merge one into another (every layer kept)")
    actions = chars.add_subparsers(dest="characters_command", required=True)
    rename = actions.add_parser("rename", help="give a character a new name (the new name must not exist)")
    rename.add_argument("old", help="the character's name now")
    rename.add_argument("new", help="its new name")
    merge = actions.add_parser("merge", help="merge a character into another existing one, then remove it")
    merge.add_argument("source", metavar="FROM", help="the character merged in (removed afterwards)")
    merge.add_argument("target", metavar="INTO", help="the character that takes its memory")
    for p in (rename, merge):
        p.add_argument("--url", help="the running server (default $NEKOMEM_URL, else the serve settings' host and port)")
        p.add_argument("--token", help="the server's API token (default $NEKOMEM_API_TOKEN)")
        p.add_argument("--memory-root", help="data folder (default: the serve settings)")
        p.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG)")
        p.add_argument("--offline", action="store_true", help="work on the folders even if a server answers at --url")


def run(args: argparse.Namespace, settings: Settings, default_url: str, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run ``characters rename|merge``; the exit status (0 done, 2 refused, 1 failed)."""
    out, err = out or sys.stdout, err or sys.stderr
    root = Path(settings.server.memory_root)
    action = args.characters_command
    try:
        first, second = (args.old, args.new) if action == "rename" else (args.source, args.target)
        first, second = validate_name(first), validate_name(second)
        server = None if args.offline else _Server.find(args.url or os.environ.get("NEKOMEM_URL") or default_url, args, settings)
        if server is not None:
            body = {"to": second} if action == "rename" else {"into": second}
            answer = server.call("POST", f"/api/characters/{quote(first, safe='')}/{action}", json=body)
            rows = int(answer.get("rows", 0))
        else:
            rows = _offline(action, root, first, second)
    except CommandError as exc:
        print(f"nekomem characters {action}: {exc}", file=err)
        return exc.status
    except MoveError as exc:
        print(f"nekomem characters {action}: {exc.message}", file=err)
        return 2
    except InvalidName as exc:
        print(f"nekomem characters {action}: {exc}", file=err)
        return 2
    except rootlock.RootLocked as exc:
        print(f"nekomem characters {action}: {exc} (a server is using it: pass its --url, or stop it)", file=err)
        return 2
    except (OSError, sqlite3.Error) as exc:
        print(f"nekomem characters {action}: failed: {type(exc).__name__}: {exc}", file=err)
        return 1
    if action == "rename":
        out.write(f"renamed {first} to {second}\n")
    else:
        out.write(f"merged {first} into {second} ({rows} stored turns in all); {first} is gone\n")
    return 0


def _offline(action: str, root: Path, first: str, second: str) -> int:
    now = datetime.now(timezone.utc).isoformat()
    with _quiet_root(root, f"characters {action}"):
        if first == second:
            raise MoveError("same_character", "the two names are the same")
        if action == "rename":
            rename_character(root / first, root / second, now)
            return 0
        return merge_characters(root / first, root / second, now)
