"""``POST /api/import/neko``: import a reference (N.E.K.O.) memory folder on a running server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse

from nekomem.config import neko_data
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


def import_roots(setting: str) -> list[Path]:
    """The resolved folders imports may read: the ``import_root`` setting, else every place
    N.E.K.O. keeps its data directory on this platform (read from the environment on each
    call: ``NEKO_STORAGE_SELECTED_ROOT``, then e.g. ``$XDG_DATA_HOME/N.E.K.O``,
    ``~/.local/share/N.E.K.O``, ``~/Documents/N.E.K.O`` on Linux)."""
    if setting:
        return [Path(setting).expanduser().resolve()]
    return [root.resolve() for root in neko_data.import_roots(os.environ)]


# The longest file name and path most file systems take (NAME_MAX, PATH_MAX on Linux).
_NAME_MAX = 255
_PATH_MAX = 4096


def _check_path_text(text: str) -> None:
    """ApiError 400 ``bad_source_dir`` for a path no file system can hold: a NUL or other
    control character, a name longer than 255 bytes, a path longer than 4096."""
    bad = next((c for c in text if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ApiError(400, "bad_source_dir", f"source_dir contains the control character U+{ord(bad):04X}")
    encoded = text.encode("utf-8", errors="surrogatepass")
    if len(encoded) > _PATH_MAX:
        raise ApiError(400, "bad_source_dir", f"source_dir is longer than {_PATH_MAX} bytes")
    longest = max((len(part.encode("utf-8", errors="surrogatepass")) for part in Path(text).parts), default=0)
    if longest > _NAME_MAX:
        raise ApiError(400, "bad_source_dir", f"a folder name in source_dir is longer than {_NAME_MAX} bytes ({longest})")


async def import_neko(request: Request) -> JSONResponse:
    """Import the folder and answer the report: counts per character and layer, and what
    could not be read. 400 bad folder, 404 unknown character, 409 an import is running."""
    body = _decode(await read_body(request))
    _check_path_text(body.source_dir)
    source = Path(body.source_dir)
    if not source.is_absolute():
        raise ApiError(400, "source_dir_not_absolute", "source_dir must be an absolute path on the server's machine")
    runtime = runtime_of(request)
    roots = import_roots(runtime.settings.importer.import_root)
    # Resolved (symbolic links and '..' followed) before anything else: whether the path
    # exists is never part of the answer unless it is inside an import root.
    try:
        resolved = source.resolve()
    except (OSError, ValueError) as exc:  # a loop of links, a name the system refuses
        raise ApiError(400, "bad_source_dir", f"source_dir cannot be resolved: {exc}") from None
    if not any(resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(root) for root in roots)
        raise ApiError(
            403,
            "outside_import_root",
            f"source_dir must lie under an import root ({shown}; setting import_root)",
            import_root=str(roots[0]),
            import_roots=[str(root) for root in roots],
        )
    try:
        report = await asyncio.to_thread(runtime.importing.import_neko, source, body.characters)
    except SourceError as exc:
        raise ApiError(404 if exc.code == "unknown_character" else 400, exc.code, str(exc)) from None
    except ImportRunning as exc:
        raise ApiError(409, "import_running", str(exc)) from None
    return JSONResponse(report.to_builtins())
