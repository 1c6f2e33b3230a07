"""The working context of /new_dialog and the text of /get_recent_history.

Order (SPEC §5): the long-term block (persona and reflection sections, rendered by
:mod:`nekomem.domain.render_longterm`), the inner-thoughts header with the current time,
the recent memo and raw turns, then a gap hint when the last turn is old.
"""

from __future__ import annotations

import re
from datetime import datetime

from nekomem.domain.turns import Turn, parse_timestamp

# Bracketed asides (timestamps the chat client prefixes, emotion tags) are not context.
_BRACKETS = re.compile(r"(\[.*?\]|\(.*?\)|（.*?）|【.*?】|\{.*?\}|<.*?>)")


def speaker(turn: Turn, master_name: str, character_name: str) -> str:
    return {"human": master_name, "ai": character_name, "system": "System"}[turn.role]


def history_lines(window: list[Turn], master_name: str, character_name: str) -> list[str]:
    lines = []
    for turn in window:
        text = turn.text if turn.role == "system" else _BRACKETS.sub("", turn.text).strip()
        lines.append(f"{speaker(turn, master_name, character_name)} | {text}")
    return lines


def format_elapsed(seconds: float) -> str:
    """"2 days and 3 hours", "1 hour and 5 minutes", "40 minutes"."""
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60

    def unit(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    if days:
        if hours:
            return f"{unit(days, 'day')} and {unit(hours, 'hour')}"
        if minutes:
            return f"{unit(days, 'day')} and {unit(minutes, 'minute')}"
        return unit(days, "day")
    if hours:
        return f"{unit(hours, 'hour')} and {unit(minutes, 'minute')}" if minutes else unit(hours, "hour")
    return unit(minutes, "minute")


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
) -> str:
    parts: list[str] = []
    parts.append(f"\n======{character_name}'s Long-term Memory======\n")
    if longterm:
        parts.append(longterm.rstrip("\n") + "\n")
    parts.append(f"\n\n======{character_name}'s Inner Thoughts======\n")
    stamp = now.strftime("%A, %B %d, %Y at %I:%M %p")
    parts.append(
        f"The current time is {stamp}. Before the conversation begins, {character_name} is mentally reviewing recent events.\n"
    )
    for line in history_lines(window, master_name, character_name):
        parts.append(line + "\n")
    gap = gap_seconds(last_timestamp, now)
    if gap is not None and gap >= gap_notice_seconds:
        notice = f"It has been {format_elapsed(gap)} since the last chat with {master_name}."
        if gap >= gap_long_seconds:
            parts.append(
                f"The current time is {now.strftime('%Y-%m-%d %H:%M')}. {notice} "
                f"{character_name} realises it has been a long time since talking with {master_name}; "
                f"what has happened meanwhile? {character_name} wants to know how {master_name} has been.\n"
            )
        else:
            parts.append(notice + "\n")
    return "".join(parts)


def render_recent_history(window: list[Turn], master_name: str, character_name: str) -> str:
    if not window:
        return f"No recent conversation with {character_name}."
    intro = f"Recent conversation between {master_name} and {character_name}:\n"
    return intro + "\n".join(history_lines(window, master_name, character_name))
