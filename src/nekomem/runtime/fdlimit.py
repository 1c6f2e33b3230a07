"""File descriptors: the process's RLIMIT_NOFILE and the active set it can hold.

Each active character keeps 3 files open (its ``time_indexed.db`` connection with its WAL
and shared-memory files); every client connection is one more. Under the common soft limit
of 1,024 the default ``max_active_characters`` (1,000) would need ~3,000, and the 340th
character would fail to open its journal. At start-up :func:`plan` raises the soft limit to
the hard limit (``fd_raise_soft_limit``) and bounds the active set by what is left after
the client connections (``max_connections``) and ``fd_reserve``; the least recently used
idle character is passivated beyond it, as beyond ``max_active_characters``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from nekomem.config import Settings

try:  # not on Windows, whose C runtime has no such limit for sockets and handles
    import resource
except ImportError:  # pragma: no cover - Windows
    resource = None  # type: ignore[assignment]

log = logging.getLogger("nekomem.runtime.fdlimit")

FDS_PER_CHARACTER = 3
# A hard limit of "unlimited" (macOS) cannot be the soft limit: this is used instead.
_UNLIMITED_SOFT = 1 << 20


@dataclass(frozen=True)
class FdPlan:
    """The soft and hard RLIMIT_NOFILE after start-up (0: unknown) and the active set
    they allow."""

    soft: int
    hard: int
    max_active: int

    def snapshot(self) -> dict[str, int]:
        """For /health: the limits, the files open now and the active-set bound."""
        return {"soft_limit": self.soft, "hard_limit": self.hard, "open": open_count(), "max_active_characters": self.max_active}


def open_count() -> int:
    """File descriptors open in this process now (-1 where that cannot be seen)."""
    for folder in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(folder)) - 1  # the listing's own descriptor
        except OSError:
            continue
    return -1


def _raise_soft() -> tuple[int, int]:
    """Raise the soft limit to the hard one; the (soft, hard) limits after (0, 0 unknown)."""
    if resource is None:
        return 0, 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED_SOFT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            log.info("raised the open-file soft limit from %d to %d", soft, target)
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file soft limit from %d (%s)", soft, exc)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft, hard


def plan(settings: Settings) -> FdPlan:
    """Apply ``fd_raise_soft_limit`` and size the active set from the soft limit: at most
    ``max_active_characters``, and no more than (soft - fd_reserve - max_connections) / 3
    (at least one)."""
    rt = settings.runtime
    if rt.fd_raise_soft_limit:
        soft, hard = _raise_soft()
    elif resource is not None:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    else:
        soft, hard = 0, 0
    limit = rt.max_active_characters
    if resource is not None and 0 < soft != resource.RLIM_INFINITY:
        budget = (soft - rt.fd_reserve - settings.server.max_connections) // FDS_PER_CHARACTER
        if budget < limit:
            log.warning(
                "max_active_characters lowered from %d to %d by the open-file limit (RLIMIT_NOFILE %d)", limit, max(1, budget), soft
            )
            limit = max(1, budget)
    return FdPlan(soft=int(soft), hard=int(hard), max_active=limit)
