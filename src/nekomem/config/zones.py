"""The display time zone (``display_timezone``): one resolution for every reader.

A name that is not a known IANA zone is refused when the settings load
(:func:`nekomem.config.load_settings` raises SettingsError), so a typo stops the server
at start with the setting named, instead of failing later requests or being replaced
silently by another zone.
"""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError


def display_zone(name: str) -> ZoneInfo | None:
    """The IANA zone ``name``, or None when it is empty (the machine's local zone, which a
    caller takes at the instant it converts). Raises ValueError when ``name`` is not a
    known zone."""
    if not name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{name[:100]!r} is not a known IANA time zone (such as 'Asia/Tokyo' or 'UTC')") from None
