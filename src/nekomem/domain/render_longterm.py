"""The long-term part of the /new_dialog working context (SPEC §5, reference §7).

Order: one persona section per entity (protected entries first, then non-protected ones
chosen by evidence within ``persona_render_max_tokens``), the pending impressions, the
confirmed impressions, the past-memories block (pending, confirmed and past share
``reflection_render_max_tokens``), and the "do not bring up on your own" list (entries
mentioned more than ``longterm_mention_limit`` times within the window). Pure: suppression
is judged at ``now`` without changing any record; tokens are counted by ``count_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import net_score
from nekomem.domain.locale import longterm as loc
from nekomem.domain.records import PersonaEntry, Reflection
from nekomem.domain.reflections import anchor_time, is_past_for_render, is_suppressed

CountTokens = Callable[[str], int]


def persona_heading(entity: str, master_name: str, ai_name: str, language: str = "en") -> str:
    """The heading of one persona section."""
    key = entity if entity in ("master", "neko", "relationship") else "other"
    local = loc.heading(language, key, master=master_name, ai=ai_name, entity=entity)
    if local is not None:
        return local
    if entity == "master":
        return f"## About {master_name}"
    if entity == "neko":
        return f"## About {ai_name}"
    if entity == "relationship":
        return f"## {master_name} and {ai_name}: relationship"
    return f"## About {entity}"


def pending_heading(ai_name: str, language: str = "en") -> str:
    return loc.heading(language, "pending", ai=ai_name) or f"### {ai_name}'s recent impressions (not certain yet)"


def confirmed_heading(ai_name: str, language: str = "en") -> str:
    return loc.heading(language, "confirmed", ai=ai_name) or f"### {ai_name}'s fairly certain impressions"


def past_block_open(master_name: str, ai_name: str, language: str = "en") -> str:
    local = loc.heading(language, "past_open", master=master_name, ai=ai_name)
    if local is not None:
        return local
    return (
        "====== Older memories below ======\n"
        f"These are older impressions, kept only as background. {ai_name} should not bring "
        f"them up or ask about them unless {master_name} does first."
    )


PAST_BLOCK_CLOSE = "====== End of older memories ======"


def past_block_close(language: str = "en") -> str:
    return loc.heading(language, "past_close") or PAST_BLOCK_CLOSE


def suppressed_heading(ai_name: str, language: str = "en") -> str:
    local = loc.heading(language, "suppressed", ai=ai_name)
    if local is not None:
        return local
    return f"### Do not bring these up on your own ({ai_name} remembers them, but they came up too often recently)"


def relative_label(anchor: datetime, now: datetime, language: str = "en") -> str:
    """``today``, ``N days ago`` (< 7), ``N weeks ago`` (< 30 days) or ``N months ago``."""
    days = max(0, (now - anchor).days)
    local = loc.relative(language, days)
    if local is not None:
        return local
    if days == 0:
        return "today"
    if days < 7:
        return "1 day ago" if days == 1 else f"{days} days ago"
    if days < 30:
        weeks = days // 7
        return "1 week ago" if weeks == 1 else f"{weeks} weeks ago"
    months = max(1, days // 30)
    return "1 month ago" if months == 1 else f"{months} months ago"


def _line(text: str) -> str:
    return "- " + " ".join(text.split())


# --- persona ---------------------------------------------------------------------------------


def select_persona(
    persona: Mapping[str, Sequence[PersonaEntry]],
    now: datetime,
    settings: LongTermSettings,
    count_tokens: CountTokens,
) -> dict[str, list[PersonaEntry]]:
    """Per entity (file order): protected entries in file order (at most
    ``persona_render_protected_max_entries`` overall, outside the budget), then the
    non-protected, not suppressed entries with score >= 0 chosen globally by score (highest
    first) while their lines fit ``persona_render_max_tokens`` (one that does not fit is
    skipped and the next tried)."""
    chosen: dict[str, list[PersonaEntry]] = {entity: [] for entity in persona}
    protected_left = settings.persona_render_protected_max_entries
    candidates: list[tuple[float, int, str, PersonaEntry]] = []
    order = 0
    for entity, entries in persona.items():
        for entry in entries:
            if not entry.text.strip():
                continue
            if entry.protected:
                if protected_left > 0:
                    chosen[entity].append(entry)
                    protected_left -= 1
                continue
            if is_suppressed(entry, now, settings):
                continue
            score = net_score(entry, now, settings)
            if score < 0:
                continue
            candidates.append((score, order, entity, entry))
            order += 1
    candidates.sort(key=lambda c: (-c[0], c[1]))
    used = 0
    for _score, _order, entity, entry in candidates:
        cost = count_tokens(_line(entry.text))
        if used + cost > settings.persona_render_max_tokens:
            continue
        used += cost
        chosen[entity].append(entry)
    return chosen


def render_persona(
    persona: Mapping[str, Sequence[PersonaEntry]],
    *,
    now: datetime,
    settings: LongTermSettings,
    count_tokens: CountTokens,
    master_name: str,
    ai_name: str,
    language: str = "en",
) -> str:
    """The persona sections ("" when nothing is selected)."""
    parts: list[str] = []
    for entity, entries in select_persona(persona, now, settings, count_tokens).items():
        if entries:
            parts.append("\n".join([persona_heading(entity, master_name, ai_name, language), *(_line(e.text) for e in entries)]))
    return "\n\n".join(parts)


# --- reflections -----------------------------------------------------------------------------


class ReflectionSelection(msgspec.Struct, frozen=True):
    """The reflections chosen for rendering, by section, each in score order."""

    pending: list[Reflection]
    confirmed: list[Reflection]
    past: list[Reflection]


def _past_line(ref: Reflection, now: datetime, language: str = "en") -> str:
    anchor = anchor_time(ref, now)
    label = relative_label(anchor, now, language) if anchor is not None else ""
    return _line(f"({label}) {ref.text}" if label else ref.text)


def select_reflections(
    reflections: Iterable[Reflection],
    now: datetime,
    settings: LongTermSettings,
    count_tokens: CountTokens,
    suppressed_texts: Iterable[str] = (),
) -> ReflectionSelection:
    """Pending reflections (all), and confirmed ones that are not suppressed with score > 0
    (split into current and past by :func:`is_past_for_render`); texts equal to a suppressed
    persona entry are dropped. Chosen globally by score, highest first, while their lines
    fit ``reflection_render_max_tokens`` (skipping any that does not fit)."""
    hidden = {" ".join(t.split()) for t in suppressed_texts}
    candidates: list[tuple[float, int, str, Reflection]] = []
    for order, ref in enumerate(reflections):
        if not ref.text.strip() or " ".join(ref.text.split()) in hidden:
            continue
        score = net_score(ref, now, settings)
        if ref.status == "pending":
            candidates.append((score, order, "pending", ref))
        elif ref.status == "confirmed" and score > 0 and not is_suppressed(ref, now, settings):
            kind = "past" if is_past_for_render(ref, now, settings) else "confirmed"
            candidates.append((score, order, kind, ref))
    candidates.sort(key=lambda c: (-c[0], c[1]))
    chosen: dict[str, list[Reflection]] = {"pending": [], "confirmed": [], "past": []}
    used = 0
    for _score, _order, kind, ref in candidates:
        line = _past_line(ref, now) if kind == "past" else _line(ref.text)
        cost = count_tokens(line)
        if used + cost > settings.reflection_render_max_tokens:
            continue
        used += cost
        chosen[kind].append(ref)
    return ReflectionSelection(chosen["pending"], chosen["confirmed"], chosen["past"])


def render_reflections(
    reflections: Iterable[Reflection],
    *,
    now: datetime,
    settings: LongTermSettings,
    count_tokens: CountTokens,
    master_name: str,
    ai_name: str,
    suppressed_texts: Iterable[str] = (),
    language: str = "en",
) -> str:
    """The pending, confirmed and past sections ("" when none is selected)."""
    selection = select_reflections(reflections, now, settings, count_tokens, suppressed_texts)
    parts: list[str] = []
    if selection.pending:
        parts.append("\n".join([pending_heading(ai_name, language), *(_line(r.text) for r in selection.pending)]))
    if selection.confirmed:
        parts.append("\n".join([confirmed_heading(ai_name, language), *(_line(r.text) for r in selection.confirmed)]))
    if selection.past:
        lines = [_past_line(r, now, language) for r in selection.past]
        parts.append("\n".join([past_block_open(master_name, ai_name, language), *lines, past_block_close(language)]))
    return "\n\n".join(parts)


# --- do not bring up ---------------------------------------------------------------------------


def suppressed_entries(
    persona: Mapping[str, Sequence[PersonaEntry]],
    reflections: Iterable[Reflection],
    now: datetime,
    settings: LongTermSettings,
) -> list[str]:
    """Texts mentioned too often recently: suppressed non-protected persona entries, then
    suppressed confirmed reflections; at most ``persona_render_suppressed_max_entries``."""
    texts: list[str] = []
    for entries in persona.values():
        texts.extend(e.text for e in entries if not e.protected and e.text.strip() and is_suppressed(e, now, settings))
    texts.extend(r.text for r in reflections if r.status == "confirmed" and r.text.strip() and is_suppressed(r, now, settings))
    unique = list(dict.fromkeys(" ".join(t.split()) for t in texts))
    return unique[: settings.persona_render_suppressed_max_entries]


def render_suppressed(texts: Sequence[str], ai_name: str, language: str = "en") -> str:
    """The 'do not bring up on your own' section ("" when empty)."""
    if not texts:
        return ""
    return "\n".join([suppressed_heading(ai_name, language), *(_line(t) for t in texts)])


def render_longterm(
    persona: Mapping[str, Sequence[PersonaEntry]],
    reflections: Sequence[Reflection],
    *,
    now: datetime,
    settings: LongTermSettings,
    count_tokens: CountTokens,
    master_name: str,
    ai_name: str,
    language: str = "en",
) -> str:
    """The whole long-term block of /new_dialog: persona, pending, confirmed, past, and the
    'do not bring up' list, separated by blank lines ("" when everything is empty), with
    headings in ``language`` (nekomem.domain.locale.longterm)."""
    suppressed_persona = [e.text for entries in persona.values() for e in entries if not e.protected and is_suppressed(e, now, settings)]
    parts = [
        render_persona(
            persona,
            now=now,
            settings=settings,
            count_tokens=count_tokens,
            master_name=master_name,
            ai_name=ai_name,
            language=language,
        ),
        render_reflections(
            reflections,
            now=now,
            settings=settings,
            count_tokens=count_tokens,
            master_name=master_name,
            ai_name=ai_name,
            suppressed_texts=suppressed_persona,
            language=language,
        ),
        render_suppressed(suppressed_entries(persona, reflections, now, settings), ai_name, language),
    ]
    return "\n\n".join(p for p in parts if p)
