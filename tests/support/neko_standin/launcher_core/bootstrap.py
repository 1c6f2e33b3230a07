"""Stand-in of the reference's ``launcher_core/bootstrap.py``: where the install lives,
whether it is frozen, and the re-exec into the install's ``.venv`` (none here)."""

from __future__ import annotations

import os
import sys

IS_FROZEN = False
bundle_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _get_project_venv_python(project_dir: str) -> str | None:
    candidate = os.path.join(project_dir, ".venv", "bin", "python")
    return candidate if os.path.exists(candidate) else None


def _maybe_reexec_into_project_venv(project_dir: str) -> None:
    """Re-run ``sys.argv`` with the install's ``.venv`` Python when there is one and it is
    not the running one (the reference does the same; the stand-in has no ``.venv``)."""
    candidate = _get_project_venv_python(project_dir)
    if candidate and os.path.abspath(sys.executable) != os.path.abspath(candidate):
        os.execv(candidate, [candidate, *sys.argv])
