"""Helpers shared by every settings section.

A section is a msgspec Struct whose fields are ``Annotated[T, Meta(description=...)]`` with
a default. Field names are unique across all sections, so each one maps to exactly one
environment variable ``NEKOMEM_<FIELD_NAME_UPPER>``.
"""

from __future__ import annotations

import msgspec


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Base class of a settings section (immutable, unknown keys rejected)."""


def doc(
    text: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    pattern: str | None = None,
) -> msgspec.Meta:
    """Shorthand for ``msgspec.Meta(description=text, ...)`` with the given bounds (a None
    bound is no bound, exactly as if it were not passed). One lower and one upper bound at
    most, and a pattern only alone, as msgspec.Meta accepts; TypeError otherwise."""
    bounds = [b for b in (ge, gt, le, lt) if b is not None]
    if (ge is not None and gt is not None) or (le is not None and lt is not None) or (pattern is not None and bounds):
        raise TypeError(f"doc({text[:40]!r}): conflicting constraints")
    if pattern is not None:
        return msgspec.Meta(description=text, pattern=pattern)
    if gt is not None:
        return msgspec.Meta(description=text, gt=gt, le=le) if lt is None else msgspec.Meta(description=text, gt=gt, lt=lt)
    return msgspec.Meta(description=text, ge=ge, le=le) if lt is None else msgspec.Meta(description=text, ge=ge, lt=lt)
