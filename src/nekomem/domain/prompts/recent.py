"""Chat prompts of the recent window: ``summarize_recent`` and ``review_recent``.

Each builder returns the ``messages`` list of a chat-completions request (dicts with
``role`` and ``content``). The instructions are English; the model is told to write in the
language of the conversation. Output parsers turn the model's decoded JSON object into
the value the caller needs and raise ValueError on a wrong shape.
"""

from __future__ import annotations

import json
from typing import Any

SUMMARIZE_TASK = "summarize_recent"
REVIEW_TASK = "review_recent"

SUMMARY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"summary": {"type": "string"}},
    "required": ["summary"],
}

REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "explanation": {"type": "string"},
        "corrected_dialogue": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
                "required": ["role", "content"],
            },
        },
    },
    "required": ["explanation", "corrected_dialogue"],
}

_JSON_ONLY = "Answer with the JSON object only: no code fence, no text before or after it."


def _language_rule(master_name: str) -> str:
    return (
        f"Write in the language {master_name} uses in the conversation (if several are mixed, the one used most in their latest messages)."
    )


def stale_hint(hours: float) -> str:
    """Prefix telling the summariser that the previous summary is ``hours`` old.

    Content of the old memo that is no longer current should move to a short
    "Earlier" block at the end of the summary instead of being kept as if it were recent.
    """
    return (
        f"Note: the previous memo was written about {hours:.1f} hours ago. Whatever in it "
        "is no longer going on should not be presented as current: condense it into a short "
        'block headed "Earlier:" at the end of the summary, and let the new conversation '
        "take the main part.\n\n"
    )


def summarize_messages(
    transcript: str,
    *,
    master_name: str,
    character_name: str,
    detailed: bool,
    stale_hours: float | None = None,
) -> list[dict[str, str]]:
    """Stage-1 prompt: summarise ``transcript`` into ``{"summary": str}``.

    ``transcript`` is rendered conversation lines (``speaker | text``), possibly preceded
    by notes summarising earlier parts. ``detailed`` asks for a fuller summary (used when
    a session is swapped or settled); ``stale_hours`` set adds :func:`stale_hint`.
    """
    if detailed:
        depth = (
            "Be thorough: keep every topic, decision, plan, promise, date, name, number, "
            "preference and open question, and how the mood and the relationship evolved, "
            "in chronological order."
        )
    else:
        depth = (
            "Be concise: keep the topics, decisions, plans, promises, names, dates and "
            "the emotional tone that matter for continuing the conversation; drop small talk."
        )
    system = (
        f"You keep the memory of {character_name}, an AI companion talking with "
        f"{master_name}. You receive part of their recent conversation, one message per "
        f'line as "speaker | text"; a line from "system" is the memo of even earlier '
        f"conversations, and text before the lines may summarise earlier parts. Write one "
        f"summary of everything you receive, so that {character_name} can continue "
        f"naturally without the original messages. Refer to the two by their names "
        f"({master_name}, {character_name}), state facts plainly and do not invent anything. "
        f"{depth} {_language_rule(master_name)}\n"
        f'Output: {{"summary": "..."}}. {_JSON_ONLY}'
    )
    user = transcript
    if stale_hours is not None:
        user = stale_hint(stale_hours) + transcript
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def further_compress_messages(summary: str, *, target_words: int, master_name: str, character_name: str) -> list[dict[str, str]]:
    """Stage-2 prompt: compress an over-long ``summary`` to about ``target_words`` words."""
    system = (
        f"You keep the memory of {character_name}, an AI companion talking with "
        f"{master_name}. The summary below is too long. Compress it further to about "
        f"{target_words} words (for Chinese, Japanese or Korean: about {target_words} "
        "characters), keeping the most important facts, plans and feelings and dropping "
        "details. Keep the language of the summary, end with a complete sentence, and do "
        "not add anything new.\n"
        f'Output: {{"summary": "..."}}. {_JSON_ONLY}'
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": summary}]


def review_messages(transcript: str, *, master_name: str, character_name: str, has_memo: bool) -> list[dict[str, str]]:
    """``review_recent`` prompt over ``transcript`` (``role: text`` blocks).

    The model returns the whole dialogue corrected, one item per input message, with roles
    ``user``, ``assistant`` and (only for the memo, when ``has_memo``) ``system``.
    """
    memo_rule = (
        'The first block, from "system", is the memo of earlier conversations: return it '
        'first, with role "system", corrected only where the dialogue proves it wrong. '
        if has_memo
        else 'There is no memo: do not output any "system" message. '
    )
    system = (
        f"You review the recent memory of {character_name}, an AI companion. Below is the "
        f'latest dialogue; "user" is {master_name}, "assistant" is {character_name}. '
        f"Find what would mislead {character_name} when this dialogue is read back later: "
        f"{character_name} repeating itself, contradicting itself or the memo, stating "
        "wrong facts, breaking character, or garbled, duplicated or truncated messages. "
        "Correct only those, minimally; keep every other message exactly as it is, keep "
        f"the order, and never change what {master_name} said except to remove exact "
        "duplicates. "
        f"{memo_rule}"
        'Every other message you keep has role "user" or "assistant". '
        f"{_language_rule(master_name)} The explanation lists the corrections briefly "
        "(or says that none were needed).\n"
        'Output: {"explanation": "...", "corrected_dialogue": [{"role": "user", '
        f'"content": "..."}}, ...]}}. {_JSON_ONLY}'
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": transcript}]


def summary_from_output(obj: Any) -> str:
    """The summary of a ``summarize_recent`` answer; a non-string value is JSON-dumped.

    Raises ValueError when ``obj`` is not an object with a non-empty ``summary``.
    """
    if not isinstance(obj, dict) or "summary" not in obj:
        raise ValueError("expected an object with a 'summary' key")
    value = obj["summary"]
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    value = value.strip()
    if not value or value == "null":
        raise ValueError("empty summary")
    return value


def corrected_from_output(obj: Any) -> list[dict[str, str]]:
    """The ``corrected_dialogue`` of a ``review_recent`` answer (items not yet validated).

    Raises ValueError when ``obj`` has no list under ``corrected_dialogue``.
    """
    if not isinstance(obj, dict) or not isinstance(obj.get("corrected_dialogue"), list):
        raise ValueError("expected an object with a 'corrected_dialogue' list")
    return list(obj["corrected_dialogue"])
