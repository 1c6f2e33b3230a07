"""Helpers of the import / restore tests: the real CLI as a process, a character made by a
real server, crafted documents, and a fingerprint of every file under a folder."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.live import ROOT, LiveServer, make_settings


def nekomem(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m nekomem args`` as a process (this tree's sources first)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **(env or {})}
    for key in [k for k in full if k.startswith("NEKOMEM_") and k not in (env or {})]:
        del full[key]  # the caller's settings must not leak into the command
    return subprocess.run(
        [sys.executable, "-m", "nekomem", *args], env=full, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def fingerprint(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (links not followed) with the hash of its content."""
    out: dict[str, str] = {}
    if not folder.exists():
        return out
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def served_character(tmp: Path, name: str = "Lan") -> dict[str, Any]:
    """The ``nekomem-character`` document of a character a real server wrote (turns, facts,
    a card entry), exported through the real CLI."""
    root = tmp / "seed-memory"
    with LiveServer(make_settings(root)) as srv:
        history = [{"role": "user", "content": "I flew my kite in the park"}, {"role": "assistant", "content": "Sounds fun!"}]
        assert srv.post(f"/cache/{name}", json={"input_history": history}).status_code == 200
        facts = [{"text": "Master likes flying kites", "importance": 6, "entity": "master"}]
        assert srv.post(f"/api/characters/{name}/facts", json={"facts": facts}).status_code == 200
    out = tmp / "seed.json"
    done = nekomem("export", str(out), "--memory-root", str(root), "--offline")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))["characters"][0]
    return doc


def export_file(path: Path, *characters: dict[str, Any]) -> Path:
    """Write an export file holding ``characters`` (copied: callers go on crafting)."""
    document = {"format": "nekomem-export", "version": 1, "characters": [copy.deepcopy(c) for c in characters]}
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def renamed(doc: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["name"] = name
    return out
