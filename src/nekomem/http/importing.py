"""``POST /api/import/neko``: import a reference (N.E.K.O.) memory folder on a running server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse

from nekomem.http.bodies import read_body
from nekomem.http.errors import ApiError
from nekomem.http.runtime_access import runtime_of
from nekomem.importer.neko_source import SourceError
from nekomem.runtime.importing import ImportRunning


class ImportNekoBody(msgspec.Struct, forbid_unknown_fields=True):
    """``source_dir``: an absolute path on the server's machine; ``characters``: only these."""

    source_dir: str
    characters: list[str] | None = None


def _decode(raw: bytes) -> ImportNekoBody:
    if not raw.strip():
        raise ApiError(400, "empty_body", "the request needs a JSON object body with 'source_dir'")
    try:
        return msgspec.json.decode(raw, type=ImportNekoBody)
    except RecursionError:
        raise ApiError(400, "body_too_deep", "the body nests too deeply") from None
    except msgspec.ValidationError as exc:
        raise ApiError(422, "schema_violation", str(exc)) from None
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None


def import_root(setting: str) -> Path:
    """The resolved folder imports may read: the ``import_root`` setting, else the N.E.K.O.
    data directory (<home>/Documents/N.E.K.O)."""
    root = Path(setting).expanduser() if setting else Path.home() / "Documents" / "N.E.K.O"
    return root.resolve()


async def import_neko(request: Request) -> JSONResponse:
    """Import the folder and answer the report: counts per character and layer, and what
    could not be read. 400 bad folder, 404 unknown character, 409 an import is running."""
    body = _decode(await read_body(request))
    source = Path(body.source_dir)
    if not source.is_absolute():
        raise ApiError(400, "source_dir_not_absolute", "source_dir must be an absolute path on the server's machine")
    runtime = runtime_of(request)
    root = import_root(runtime.settings.importer.import_root)
    # Resolved (symbolic links and '..' followed) before anything else: whether the path
    # exists is never part of the answer unless it is inside the import root.
    if not source.resolve().is_relative_to(root):
        raise ApiError(
            403, "outside_import_root", f"source_dir must lie under the import root {root} (setting import_root)", import_root=str(root)
        )
    try:
        report = await asyncio.to_thread(runtime.importing.import_neko, source, body.characters)
    except SourceError as exc:
        raise ApiError(404 if exc.code == "unknown_character" else 400, exc.code, str(exc)) from None
    except ImportRunning as exc:
        raise ApiError(409, "import_running", str(exc)) from None
    return JSONResponse(report.to_builtins())
