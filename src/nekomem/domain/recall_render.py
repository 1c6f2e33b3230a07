"""The text form of recall results: the block a ``recall_memory`` tool call returns to the
model, and the tool's own JSON schema.

A block is a header line ("Found 2 relevant memories:") and one numbered line per result::

    1. [fact/about the user] Master likes Americano  (2026-05-01, 3d ago)

The tag names the tier and the entity in the block's language; the text is cut to
``recall_render_entry_max_tokens`` (never dropped), each line to that plus
``recall_render_line_overhead_tokens``, and lines past ``recall_render_total_max_tokens``
(header and newlines included) are dropped, the first one always kept. The date is the
first parseable of event end, event start, created_at, shown in ``now``'s time zone.
Languages: en, ja, zh (anything else falls back to the configured default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from nekomem.config.recall import RECALL_RENDER_LANGUAGES, RecallSettings
from nekomem.domain.tokens import TokenCounter
from nekomem.domain.turns import parse_iso

_TIER_LABELS = {
    "en": {"fact": "fact", "reflection": "impression", "fact_archive": "old fact"},
    "ja": {"fact": "事実", "reflection": "印象", "fact_archive": "過去の事実"},
    "zh": {"fact": "事实", "reflection": "印象", "fact_archive": "旧事实"},
}
_ENTITY_LABELS = {
    "en": {"master": "about the user", "neko": "about me", "relationship": "relationship"},
    "ja": {"master": "ユーザーについて", "neko": "自分について", "relationship": "関係"},
    "zh": {"master": "关于用户", "neko": "关于自己", "relationship": "关系"},
}
# now / n days / n weeks / n months ago
_AGO = {
    "en": ("now", "{n}d ago", "{n}w ago", "{n}mo ago"),
    "ja": ("今", "{n}日前", "{n}週間前", "{n}ヶ月前"),
    "zh": ("当下", "{n}天前", "{n}周前", "{n}个月前"),
}
_HEADER = {
    "en": "Found {n} relevant memories:",
    "ja": "関連する記憶を {n} 件見つけました：",
    "zh": "找到 {n} 条相关记忆：",
}
_NO_RESULT = {
    "en": "No relevant memory found.",
    "ja": "関連する記憶は見つかりませんでした。",
    "zh": "没有找到相关记忆。",
}
_NO_RESULT_LOOSEN = {
    "en": 'No memory matched "{query}" within that time range. Try loosening the filter: '
    "ask with the time only (memories nearest that period) or with the query only (any time).",
    "ja": "その期間には「{query}」に合う記憶がありませんでした。条件を緩めてみてください："
    "時間だけ（その頃に近い記憶）か、クエリだけ（期間を問わない）で呼び出せます。",
    "zh": "在该时间范围内没有与“{query}”相符的记忆。请放宽条件：只给时间（最接近该时段的记忆），或只给查询（不限时间）。",
}
_TOOL_TEXT = {
    "en": {
        "description": "Recall past memories related to the current conversation: earlier dialogue, the user's "
        "preferences, past events, or background you are missing. Provide at least one of query and time.",
        "query": 'A keyword, question or topic in one or two sentences, e.g. "the travel plan mentioned earlier" or '
        '"the user\'s coffee preferences". Leave empty for a pure time lookup.',
        "time": "Optional period. Time only: the memories closest to that period; with a query: the query searched "
        "inside the period. Forms: 2026-05-01T14 (hour), 2026-05-01 (day), 2026-05 (month), 2026 (year), "
        'ranges such as 2026-05-01/2026-05-07, or natural expressions like "yesterday", "last week", '
        '"3 days ago", "last March".',
    },
    "ja": {
        "description": "今の会話に関係する過去の記憶を呼び出します。以前の会話、ユーザーの好み、過去の出来事、"
        "足りない背景が必要なときに使ってください。query と time の少なくとも一方を指定します。",
        "query": "キーワード・質問・話題を一、二文で（例：「前に話した旅行の計画」「ユーザーのコーヒーの好み」）。"
        "時間だけで探すときは空にします。",
        "time": "任意の期間。time だけならその期間に最も近い記憶、query と一緒ならその期間の中で検索します。"
        "形式：2026-05-01T14（時）、2026-05-01（日）、2026-05（月）、2026（年）、2026-05-01/2026-05-07 の"
        "ような範囲、または「昨日」「先週」「3日前」のような表現。",
    },
    "zh": {
        "description": "回忆与当前对话相关的过去记忆。需要之前的对话、用户的喜好、过去的事件或缺少的背景时调用。"
        "query 和 time 至少提供一个。",
        "query": "一两句话的关键词、问题或话题，例如“之前提到的旅行计划”或“用户的咖啡喜好”。只按时间查找时留空。",
        "time": "可选的时间段。只给时间：返回最接近该时段的记忆；同时给查询：在该时段内进行检索。格式：2026-05-01T14（小时）、"
        "2026-05-01（日）、2026-05（月）、2026（年）、2026-05-01/2026-05-07 这样的范围，或“昨天”“上周”“三天前”等说法。",
    },
}


def normalise_language(language: object, default: str = "en") -> str:
    """``en``, ``ja`` or ``zh`` for a language tag such as ``ja-JP`` or ``zh-TW``; else ``default``."""
    if isinstance(language, str):
        base = language.strip().lower().replace("_", "-").split("-")[0]
        if base in RECALL_RENDER_LANGUAGES:
            return base
    return default if default in RECALL_RENDER_LANGUAGES else "en"


def entry_tag(tier: object, entity: object, language: str) -> str:
    """``[tier label/entity label]``; unknown values pass through, an empty one shows ``-``."""
    tier_s = str(tier or "").strip()
    entity_s = str(entity or "").strip()
    tier_label = _TIER_LABELS[language].get(tier_s, tier_s) or "-"
    entity_label = _ENTITY_LABELS[language].get(entity_s, entity_s) or "-"
    return f"[{tier_label}/{entity_label}]"


def _parse(value: object) -> datetime | None:
    return parse_iso(value)


def anchor_of(result: Mapping[str, Any]) -> datetime | None:
    """The first parseable of event_end_at, event_start_at, created_at."""
    for key in ("event_end_at", "event_start_at", "created_at"):
        found = _parse(result.get(key))
        if found is not None:
            return found
    return None


def relative_label(anchor: datetime, now: datetime, language: str) -> str:
    """now / N days / N weeks (7-29 days) / N months (30+ days) ago; "" for a future anchor."""
    days = (now.astimezone(timezone.utc) - anchor.astimezone(timezone.utc)).days
    if days < 0:
        return ""
    table = _AGO[language]
    if days == 0:
        return table[0]
    if days < 7:
        return table[1].format(n=days)
    if days < 30:
        return table[2].format(n=days // 7)
    return table[3].format(n=days // 30)


def time_suffix(result: Mapping[str, Any], now: datetime, language: str) -> str:
    anchor = anchor_of(result)
    if anchor is None:
        return ""
    local = anchor.astimezone(now.tzinfo) if now.tzinfo is not None else anchor
    label = relative_label(anchor, now, language)
    date = local.strftime("%Y-%m-%d")
    return f"  ({date}, {label})" if label else f"  ({date})"


def render_recall_block(
    results: Sequence[Mapping[str, Any]],
    *,
    now: datetime,
    language: str,
    counter: TokenCounter,
    settings: RecallSettings,
    header: bool = True,
) -> tuple[str, int]:
    """The rendered block and how many result lines it kept (see the module docstring).

    An empty ``results`` gives ``("", 0)``; the caller chooses the no-result text.
    """
    s = settings
    lines: list[str] = []
    for index, result in enumerate(results, start=1):
        text = " ".join(str(result.get("text") or "").split())
        text = counter.truncate(text, s.recall_render_entry_max_tokens)
        line = f"{index}. {entry_tag(result.get('tier'), result.get('entity'), language)} {text}{time_suffix(result, now, language)}"
        lines.append(counter.truncate(line, s.recall_render_entry_max_tokens + s.recall_render_line_overhead_tokens))
    if not lines:
        return "", 0
    budget = s.recall_render_total_max_tokens
    if header:
        budget -= counter.count(_HEADER[language].format(n=len(lines))) + counter.count("\n")
    newline = counter.count("\n")
    kept: list[str] = []
    used = 0
    for line in lines:
        cost = counter.count(line) + (newline if kept else 0)
        if kept and used + cost > budget:
            break
        kept.append(line)
        used += cost
    body = "\n".join(kept)
    if header:
        body = _HEADER[language].format(n=len(kept)) + "\n" + body
    return body, len(kept)


def no_result_text(language: str, query: str = "", *, loosen: bool = False) -> str:
    """The tool answer for no results; ``loosen`` (query and time both given) suggests
    dropping one of them."""
    if loosen and query:
        return _NO_RESULT_LOOSEN[language].format(query=query)
    return _NO_RESULT[language]


def recall_tool_schema(language: str) -> dict[str, Any]:
    """The ``recall_memory`` tool definition (OpenAI function style) in ``language``."""
    text = _TOOL_TEXT[language]
    return {
        "name": "recall_memory",
        "description": text["description"],
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": text["query"]},
                "time": {"type": "string", "description": text["time"]},
            },
            "required": [],
        },
    }
