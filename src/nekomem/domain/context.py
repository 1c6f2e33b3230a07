"""The working context of /new_dialog and the text of /get_recent_history.

Order (SPEC §5): the long-term block (persona and reflection sections, rendered by
:mod:`nekomem.domain.render_longterm`), the inner-thoughts header with the current time,
the recent memo and raw turns, then a gap hint when the last turn is old.
"""

from __future__ import annotations

import functools
import re
from datetime import datetime

from nekomem.domain import theater
from nekomem.domain.locale import context as loc
from nekomem.domain.locale.theater import capsule_text
from nekomem.domain.turns import Turn, parse_timestamp

# Bracketed asides (timestamps the chat client prefixes, emotion tags) are not context.
_BRACKETS = re.compile(r"(\[.*?\]|\(.*?\)|（.*?）|【.*?】|\{.*?\}|<.*?>)")


def speaker(turn: Turn, master_name: str, character_name: str) -> str:
    return {"human": master_name, "ai": character_name, "system": "System"}[turn.role]


def shown_text(turn: Turn) -> str:
    """A turn's text as a context shows it: without bracketed asides, except a system
    turn's (the memo), which is shown whole."""
    return turn.text if turn.role == "system" else _BRACKETS.sub("", turn.text).strip()


def history_lines(
    window: list[Turn], master_name: str, character_name: str, shown: list[str] | None = None, language: str = "en"
) -> list[str]:
    """``speaker | text`` per window item; ``shown``, when given, holds each item's
    :func:`shown_text` already (the recent actor keeps them, so a /new_dialog does not strip
    the whole window again). A theater capsule shows as its note in ``language``, once per
    story session (:func:`nekomem.domain.theater.rendered_lines`)."""
    names = {"human": master_name, "ai": character_name, "system": "System"}
    texts = shown if shown is not None and len(shown) == len(window) else [shown_text(t) for t in window]
    capsules: dict[int, str | None] = {}
    if any(t.metadata for t in window):
        render = functools.partial(capsule_text, language=language, name=character_name, master=master_name)
        capsules = theater.rendered_lines(window, render)
    lines: list[str] = []
    for index, (turn, text) in enumerate(zip(window, texts, strict=True)):
        if index in capsules:
            note = capsules[index]
            if note is not None:
                lines.append(note)  # as the reference: the note alone, no speaker
            continue
        lines.append(f"{names[turn.role]} | {text}")
    return lines


def gap_seconds(last_timestamp: str | None, now: datetime) -> float | None:
    if not last_timestamp:
        return None
    try:
        return max(0.0, (now - parse_timestamp(last_timestamp)).total_seconds())
    except ValueError:
        return None


def render_new_dialog(
    *,
    character_name: str,
    master_name: str,
    window: list[Turn],
    last_timestamp: str | None,
    now: datetime,
    longterm: str,
    gap_notice_seconds: float,
    gap_long_seconds: float,
    language: str = "en",
    shown: list[str] | None = None,
) -> str:
    """The /new_dialog text in ``language`` (one of context_locale.LANGUAGES); ``shown`` as
    in :func:`history_lines`."""
    name, master = character_name, master_name
    parts: list[str] = []
    if longterm.strip():  # no empty "Long-term Memory" heading for a character without any
        parts += [loc.text(loc.PERSONA_HEADER, language, name=name), longterm.rstrip("\n") + "\n"]
    parts.append(loc.text(loc.INNER_THOUGHTS_HEADER, language, name=name))
    stamp = now.strftime("%A, %B %d, %Y at %I:%M %p")
    parts.append(loc.text(loc.INNER_THOUGHTS_DYNAMIC, language, name=name, time=stamp))
    for line in history_lines(window, master, name, shown, language):
        parts.append(line + "\n")
    gap = gap_seconds(last_timestamp, now)
    if gap is not None and gap >= gap_notice_seconds:
        notice = loc.text(loc.CHAT_GAP_NOTICE, language, master=master, elapsed=loc.format_elapsed(gap, language))
        if gap >= gap_long_seconds:
            current = loc.text(loc.CHAT_GAP_CURRENT_TIME, language, now=now.strftime("%Y-%m-%d %H:%M"))
            parts.append(current + notice + loc.text(loc.CHAT_GAP_LONG_HINT, language, name=name, master=master) + "\n")
        else:
            parts.append(notice + "\n")
    return "".join(parts)


def render_recent_history(
    window: list[Turn], master_name: str, character_name: str, language: str = "en", shown: list[str] | None = None
) -> str:
    if not window:
        return loc.text(loc.NO_RECENT_HISTORY, language, name=character_name)
    intro = loc.text(loc.RECENT_HISTORY_INTRO, language, master=master_name, name=character_name)
    return intro + "\n".join(history_lines(window, master_name, character_name, shown, language))
