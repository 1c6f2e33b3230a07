"""Repeated phrases in the character's recent replies (``repetition_insights``), model-free.

The reference's memory browser asks for the phrases its character keeps repeating, to
review them by hand. This miner is nekomem's own, simpler than the reference's: each
reply is stripped of bracketed asides (the chat server's ``[YYYYMMDD Ddd HH:MM]`` stamp,
emotion tags) and cut into candidate phrases: runs of 2 to 6 words for languages written
with spaces, runs of 3 to 8 characters inside CJK / kana / hangul text for zh, ja and
ko. A phrase is a candidate when it occurs in at least ``min_messages`` replies; a phrase
contained in a longer candidate found in as many replies is dropped (the longer one says
it). Candidates are ordered by replies, then occurrences, then length. Only the phrases,
their counts and their language leave this module: no reply text.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

SCHEMA_VERSION = "natural-expression-candidates/v1"
ARTIFACT_TYPE = "user_review_candidates"
LANGUAGES = ("en", "es", "pt", "ru", "ja", "ko", "zh-CN", "zh-TW")
_CJK_LANGUAGES = {"ja", "ko", "zh-CN", "zh-TW"}
_BRACKETS = re.compile(r"(\[.*?\]|\(.*?\)|（.*?）|【.*?】|\{.*?\}|<.*?>)")
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*", re.UNICODE)
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")
_WORDS = (2, 6)
_CHARS = (3, 8)


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _phrases(text: str, cjk: bool) -> list[tuple[str, str]]:
    """(normalized phrase, phrase as written) for every window of one reply."""
    text = _BRACKETS.sub(" ", text)
    out: list[tuple[str, str]] = []
    if cjk:
        for run in _CJK_RUN.findall(text):
            for size in range(_CHARS[0], min(_CHARS[1], len(run)) + 1):
                out.extend((_normal(run[i : i + size]), run[i : i + size]) for i in range(len(run) - size + 1))
        return out
    words = _WORD.findall(text)
    for size in range(_WORDS[0], min(_WORDS[1], len(words)) + 1):
        for i in range(len(words) - size + 1):
            written = " ".join(words[i : i + size])
            out.append((_normal(written), written))
    return out


def mine(replies: Sequence[str], language: str, *, min_messages: int, max_candidates: int) -> dict[str, Any]:
    """The report: ``{"candidates": [...], "candidate_count", "returned_candidate_count",
    "candidates_truncated"}`` for ``replies`` written in ``language`` (one of LANGUAGES)."""
    cjk = language in _CJK_LANGUAGES
    in_messages: Counter[str] = Counter()
    occurrences: Counter[str] = Counter()
    written: dict[str, str] = {}
    for reply in replies:
        found = _phrases(reply, cjk)
        occurrences.update(p for p, _w in found)
        in_messages.update({p for p, _w in found})
        for phrase, as_written in found:
            written.setdefault(phrase, as_written)
    frequent = {p: n for p, n in in_messages.items() if n >= min_messages}
    # Longest first, so a phrase is checked against the longer candidates kept before it.
    kept: list[str] = []
    for phrase in sorted(frequent, key=lambda p: (-len(p), p)):
        if any(phrase in longer and frequent[longer] >= frequent[phrase] for longer in kept):
            continue
        kept.append(phrase)
    kept.sort(key=lambda p: (-frequent[p], -occurrences[p], -len(p), p))
    rows = [
        {
            "phrase": written[p],
            "normalized_phrase": p,
            "language": language,
            "message_count": frequent[p],
            "occurrence_count": occurrences[p],
            "covered_by_rule_ids": [],
            "status": "pending",
        }
        for p in kept[:max_candidates]
    ]
    return {
        "candidates": rows,
        "candidate_count": len(kept),
        "returned_candidate_count": len(rows),
        "candidates_truncated": len(kept) > len(rows),
    }
