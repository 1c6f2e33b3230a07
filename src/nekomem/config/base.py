"""Helpers shared by every settings section.

A section is a msgspec Struct whose fields are ``Annotated[T, Meta(description=...)]`` with
a default. Field names are unique across all sections, so each one maps to exactly one
environment variable ``NEKOMEM_<FIELD_NAME_UPPER>``.
"""

from __future__ import annotations

import msgspec


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """Base class of a settings section (immutable, unknown keys rejected)."""


def doc(text: str, **constraints: object) -> msgspec.Meta:
    """Shorthand for ``msgspec.Meta(description=text, **constraints)``."""
    return msgspec.Meta(description=text, **constraints)  # type: ignore[arg-type]
