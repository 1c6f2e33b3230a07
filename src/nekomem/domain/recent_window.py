"""Pure logic of the recent window: rendering, compression, hard cap, splicing.

The window is a list of :class:`Turn`; an optional memo (role ``system``) sits at index 0.
Nothing here does I/O or keeps state: the owning actor passes a snapshot in and applies
the result. :func:`compress` calls the summariser through the callable it is given (and so
should run on a worker thread); every other function is cheap and deterministic.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence

import msgspec

from nekomem.config.recent import RecentSettings
from nekomem.domain.prompts import recent as prompts_recent
from nekomem.domain.tokens import TokenCounter
from nekomem.domain.turns import Turn

log = logging.getLogger(__name__)

_DEFAULTS = RecentSettings()

Summarize = Callable[[list[dict[str, str]]], str]
"""Runs one ``summarize_recent`` request and returns the summary; raises on failure."""

# Separators of rendered lines and of joined partial summaries (one token each in
# o200k/cl100k); a chunk's size is counted as the sum of its parts plus separators.
_LINE_SEP = "\n"
_PARTIAL_SEP = "\n\n"


class CompressResult(msgspec.Struct, frozen=True):
    """Outcome of a successful compression.

    ``memo`` is the system turn that replaces the snapshot, ``summary`` its text without
    the prefix, ``llm_calls`` every summariser call made (failed ones included) and
    ``used_stale_hint`` whether the stale hint was sent (the caller then moves its anchor).
    """

    memo: Turn
    summary: str
    llm_calls: int
    used_stale_hint: bool


class _Failed(Exception):
    """A summariser call raised; ends the map-reduce."""


def speaker(turn: Turn, master_name: str, character_name: str) -> str:
    """Name shown for ``turn`` in rendered history."""
    if turn.role == "human":
        return master_name
    if turn.role == "ai":
        return character_name
    return "system"


def render_lines(
    turns: Sequence[Turn],
    master_name: str,
    character_name: str,
    counter: TokenCounter,
    per_message_max_tokens: int,
    *,
    marker: str | None = None,
) -> list[str]:
    """One ``"{speaker} | {text}"`` line per turn, each text head/tail cut to the limit.

    ``marker`` (default: the ``recent_truncation_marker`` setting's default) joins the
    kept head and tail of a cut message.
    """
    mark = _DEFAULTS.recent_truncation_marker if marker is None else marker
    return [f"{speaker(t, master_name, character_name)} | {counter.head_tail(t.text, per_message_max_tokens, mark)}" for t in turns]


def window_tokens(turns: Sequence[Turn], counter: TokenCounter) -> int:
    """Sum of the raw text tokens of ``turns`` (what the hard cap bounds)."""
    return sum(counter.count(t.text) for t in turns)


def cut_to_sentence_end(text: str, marks: str) -> str:
    """``text`` cut back to its last sentence-final mark (unchanged if it has none)."""
    last = max((text.rfind(m) for m in marks), default=-1)
    if last <= 0:
        return text.strip()
    cut = text[: last + 1].strip()
    return cut or text.strip()


def _pack(pieces: list[str], sep: str, budget: int, counter: TokenCounter, marker: str) -> list[str]:
    """Join consecutive pieces into groups of at most ``budget`` tokens, never splitting one.

    A piece over the budget on its own is head/tail cut to the budget.
    """
    sep_tokens = counter.count(sep)
    groups: list[str] = []
    current: list[str] = []
    size = 0
    for piece in pieces:
        n = counter.count(piece)
        if n > budget:
            piece = counter.head_tail(piece, budget, marker)
            n = counter.count(piece)
        extra = n + (sep_tokens if current else 0)
        if current and size + extra > budget:
            groups.append(sep.join(current))
            current, size = [], 0
            extra = n
        current.append(piece)
        size += extra
    if current:
        groups.append(sep.join(current))
    return groups


class _Run:
    """One compression: counts calls and holds the fixed prompt parameters."""

    def __init__(
        self,
        summarize: Summarize,
        settings: RecentSettings,
        counter: TokenCounter,
        character_name: str,
        detailed: bool,
    ) -> None:
        self.summarize = summarize
        self.settings = settings
        self.counter = counter
        self.character_name = character_name
        self.detailed = detailed
        self.calls = 0

    def call(self, messages: list[dict[str, str]]) -> str | None:
        self.calls += 1
        try:
            out = self.summarize(messages)
        except Exception as exc:  # noqa: BLE001 - any failure of the callable is a failed call
            log.info("summarize_recent call %d failed: %s", self.calls, type(exc).__name__)
            return None
        if not isinstance(out, str) or not out.strip():
            log.info("summarize_recent call %d returned an empty summary", self.calls)
            return None
        return out.strip()

    def stage1(self, text: str, stale_hours: float | None) -> str | None:
        return self.call(
            prompts_recent.summarize_messages(
                text,
                master_name=self.settings.master_name,
                character_name=self.character_name,
                detailed=self.detailed,
                stale_hours=stale_hours,
            )
        )

    def stage2(self, summary: str) -> str | None:
        return self.call(
            prompts_recent.further_compress_messages(
                summary,
                target_words=self.settings.recent_stage2_target_words,
                master_name=self.settings.master_name,
                character_name=self.character_name,
            )
        )

    def map_reduce(self, lines: list[str]) -> str | None:
        """Reduce over-budget input to at most the budget; None when a call fails."""
        s, c = self.settings, self.counter
        budget = s.recent_compress_input_budget_tokens
        partials: list[str] = []
        for chunk in _pack(lines, _LINE_SEP, budget, c, s.recent_truncation_marker):
            out = self.stage1(chunk, None)
            if out is None:
                return None
            partials.append(out)
        depth = 0
        while len(partials) > 1 and c.count(_PARTIAL_SEP.join(partials)) > budget and depth < s.recent_map_reduce_max_depth:
            batches = _pack(partials, _PARTIAL_SEP, budget, c, s.recent_truncation_marker)
            if len(batches) >= len(partials):
                break  # every partial is already alone in its batch: no progress possible
            reduced: list[str] = []
            for batch in batches:
                out = self.stage1(batch, None)
                if out is None:
                    return None
                reduced.append(out)
            partials = reduced
            depth += 1
        merged = _PARTIAL_SEP.join(partials)
        if c.count(merged) > budget:
            merged = c.truncate(merged, budget)
        return merged


def _rounds(run: _Run, text: str, hint_hours: float | None, s: RecentSettings, counter: TokenCounter) -> str | None:
    """The summary of ``text`` after up to ``recent_compress_max_rounds`` stage-1/stage-2
    rounds (see :func:`compress`); None when a stage-1 call fails."""
    limit = s.recent_summary_max_tokens
    marks = s.recent_sentence_final_marks
    last_stage1 = ""
    for _ in range(s.recent_compress_max_rounds):
        first = run.stage1(text, hint_hours)
        if first is None:
            return None
        last_stage1 = first
        if counter.count(first) <= limit:
            return first
        second = run.stage2(first)
        if second is None:
            continue
        second = cut_to_sentence_end(second, marks)
        if counter.count(second) > limit:
            second = cut_to_sentence_end(counter.truncate(second, limit), marks)
        if second:
            return second
    return cut_to_sentence_end(counter.truncate(last_stage1, limit), marks)


def compress(
    snapshot: list[Turn],
    summarize: Summarize,
    settings: RecentSettings,
    counter: TokenCounter,
    *,
    character_name: str,
    detailed: bool,
    stale_hours: float | None,
) -> CompressResult | None:
    """Summarise ``snapshot`` into one memo turn, or None when the summariser fails.

    Input over ``recent_compress_input_budget_tokens`` is first map-reduced (each chunk
    and batch summarised with the stage-1 prompt; any failed call → None). Then up to
    ``recent_compress_max_rounds`` rounds: stage-1 (failure → None); a result within
    ``recent_summary_max_tokens`` is accepted, a longer one goes to stage-2, whose output
    is cut back to its last sentence-final mark (and to the limit); a failed stage-2 starts
    the next round. If every round's stage-2 fails, the last stage-1 summary is cut to the
    limit. ``stale_hours`` is the age of the previous summary (None: no previous summary);
    at or above ``recent_summary_stale_hours`` the stage-1 prompt carries the stale hint.
    ``summarize`` may raise any Exception; this function itself raises nothing for it.
    """
    if not snapshot:
        return None
    s = settings
    run = _Run(summarize, s, counter, character_name, detailed)
    lines = render_lines(
        snapshot,
        s.master_name,
        character_name,
        counter,
        s.recent_per_message_max_tokens,
        marker=s.recent_truncation_marker,
    )
    text = _LINE_SEP.join(lines)
    if counter.count(text) > s.recent_compress_input_budget_tokens:
        merged = run.map_reduce(lines)
        if merged is None:
            log.info("recent compression failed in map-reduce after %d calls", run.calls)
            return None
        text = merged
    use_hint = stale_hours is not None and stale_hours >= s.recent_summary_stale_hours
    hint_hours = stale_hours if use_hint else None
    summary = _rounds(run, text, hint_hours, s, counter)
    if summary is None:
        log.info("recent compression failed at stage 1 after %d calls", run.calls)
        return None
    memo = Turn(role="system", text=s.recent_memo_prefix + summary, ts=snapshot[-1].ts)
    log.info(
        "recent compression done: %d turns, %d calls, stale_hint=%s",
        len(snapshot),
        run.calls,
        use_hint,
    )
    return CompressResult(memo=memo, summary=summary, llm_calls=run.calls, used_stale_hint=use_hint)


def needs_compression(window: Sequence[Turn], settings: RecentSettings) -> bool:
    """True when the window holds more than ``recent_compress_threshold_items`` items."""
    return len(window) > settings.recent_compress_threshold_items


def repeated_prefix(stored_tail: Sequence[Turn], new: Sequence[Turn]) -> int:
    """How many leading turns of ``new`` repeat the end of ``stored_tail`` (role + text;
    the longest such run), so they are not stored twice."""
    for k in range(min(len(stored_tail), len(new)), 0, -1):
        if all(a.role == b.role and a.text == b.text for a, b in zip(stored_tail[-k:], new[:k], strict=True)):
            return k
    return 0


def compression_snapshot(window: Sequence[Turn], settings: RecentSettings) -> list[Turn]:
    """The head to summarise: all but the newest ``recent_history_max_items - 1`` items."""
    keep = settings.recent_history_max_items - 1
    if len(window) <= keep:
        return []
    return list(window[: len(window) - keep])


def splice_memo(
    current: Sequence[Turn], snapshot: Sequence[Turn], memo: Turn, keep: Callable[[Turn], bool] | None = None
) -> list[Turn] | None:
    """Compare-and-set: ``[memo] + current[len(snapshot):]`` if ``snapshot`` is still the
    exact head of ``current``, else None (the result is moot). Items of the snapshot for
    which ``keep`` is true stay, in order, right after the memo (they were not summarised)."""
    n = len(snapshot)
    if n == 0 or len(current) < n or list(current[:n]) != list(snapshot):
        return None
    kept = [t for t in snapshot if keep(t)] if keep is not None else []
    return [memo, *kept, *current[n:]]


def _with_text(turn: Turn, text: str) -> Turn:
    return msgspec.structs.replace(turn, text=text)


def enforce_hard_cap(window: Sequence[Turn], settings: RecentSettings, counter: TokenCounter) -> list[Turn]:
    """Bound the window to ``recent_hard_cap_tokens`` raw tokens, keeping order.

    A window within the cap is returned unchanged. Otherwise the head memo (a system turn
    at index 0) is kept, then the newest items walking back while they fit; the oldest
    raw items go first. When the memo and the newest item do not fit together, the memo
    yields down to ``recent_hard_cap_memo_share`` of the cap and is head/tail cut. Among
    the newest ``recent_hard_cap_min_items`` an item that does not fit whole is head/tail
    cut to the room left (never beyond it), and the walk stops after it.
    """
    s = settings
    cap = s.recent_hard_cap_tokens
    items = list(window)
    if window_tokens(items, counter) <= cap:
        return items
    marker = s.recent_truncation_marker
    memo: Turn | None = items[0] if items and items[0].role == "system" else None
    raw = items[1:] if memo is not None else items
    room = cap
    if memo is not None:
        memo_tokens = counter.count(memo.text)
        newest = counter.count(raw[-1].text) if raw else 0
        memo_room = cap
        if memo_tokens + newest > cap:
            memo_room = max(cap - newest, int(cap * s.recent_hard_cap_memo_share))
        if memo_tokens > memo_room:
            cut_memo = counter.head_tail(memo.text, memo_room, marker)
            memo = _with_text(memo, cut_memo) if cut_memo else None
            memo_tokens = counter.count(cut_memo)
        room -= memo_tokens
    kept: list[Turn] = []
    for turn in reversed(raw):
        n = counter.count(turn.text)
        if n <= room:
            kept.append(turn)
            room -= n
            continue
        if len(kept) < s.recent_hard_cap_min_items and room > 0:
            cut = counter.head_tail(turn.text, room, marker)
            if cut:
                kept.append(_with_text(turn, cut))
        break
    kept.reverse()
    result = ([memo] if memo is not None else []) + kept
    log.info("recent hard cap: %d -> %d items (cap %d tokens)", len(items), len(result), cap)
    return result


def _entry(turn: Turn, prefix_chars: int) -> str:
    digest = hashlib.sha256(turn.text.encode("utf-8")).hexdigest()
    return f"{turn.role}:{digest}:{turn.text[:prefix_chars]}"


def tail_fingerprint(turns: Sequence[Turn], k: int, prefix_chars: int | None = None) -> list[str]:
    """Fingerprint of the last ``k`` turns, oldest first.

    Each entry is ``"{role}:{sha256 of the full text}:{text[:prefix_chars]}"``
    (``prefix_chars`` defaults to the ``review_fingerprint_prefix_chars`` default). An
    entry with an empty hash (``"{role}::{prefix}"``) is a legacy prefix-only entry and
    matches on role and prefix.
    """
    n = _DEFAULTS.review_fingerprint_prefix_chars if prefix_chars is None else prefix_chars
    tail = list(turns[-k:]) if k > 0 else []
    return [_entry(t, n) for t in tail]


def entry_matches(entry: str, turn: Turn) -> bool:
    """Whether one fingerprint entry describes ``turn``."""
    parts = entry.split(":", 2)
    if len(parts) != 3:
        return False
    role, digest, prefix = parts
    if role != turn.role:
        return False
    if digest:
        return digest == hashlib.sha256(turn.text.encode("utf-8")).hexdigest()
    return turn.text.startswith(prefix)


def locate_fingerprint(turns: Sequence[Turn], fingerprint: Sequence[str]) -> int | None:
    """Index of the last turn of the latest place where ``fingerprint`` matches, or None."""
    k = len(fingerprint)
    if k == 0:
        return None
    for end in range(len(turns) - 1, k - 2, -1):
        start = end - k + 1
        if all(entry_matches(fingerprint[i], turns[start + i]) for i in range(k)):
            return end
    return None
