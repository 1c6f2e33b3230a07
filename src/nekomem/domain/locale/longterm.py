"""Localised headings of the long-term block of /new_dialog (persona sections, impressions,
the past-memories block, the "do not bring up" list) and its relative time labels.

English is nekomem's own wording (nekomem.domain.render_longterm); zh follows the
reference's headings (which the reference writes in Chinese for every language), zh-TW, ja
and ko are their translations. Other languages use English.
"""

from __future__ import annotations

HEADINGS: dict[str, dict[str, str]] = {
    "zh": {
        "master": "## 关于{master}",
        "neko": "## 关于{ai}",
        "relationship": "## 关系动态",
        "other": "## 关于{entity}",
        "pending": "### {ai}最近的印象（还不太确定）",
        "confirmed": "### {ai}比较确定的印象",
        "past_open": "======以下为较久前的记忆======\n说明：下列条目是{ai}较早之前形成的印象，仅作背景知识。除非{master}先主动提起，否则{ai}不要主动唤起或追问相关内容。",
        "past_close": "======以上为较久前的记忆======",
        "suppressed": "### 暂不主动提及的内容（{ai}记得，但最近提到太多次了，不要再主动提起）",
    },
    "zh-TW": {
        "master": "## 關於{master}",
        "neko": "## 關於{ai}",
        "relationship": "## 關係動態",
        "other": "## 關於{entity}",
        "pending": "### {ai}最近的印象（還不太確定）",
        "confirmed": "### {ai}比較確定的印象",
        "past_open": "======以下為較久前的記憶======\n說明：下列條目是{ai}較早之前形成的印象，僅作背景知識。除非{master}先主動提起，否則{ai}不要主動喚起或追問相關內容。",
        "past_close": "======以上為較久前的記憶======",
        "suppressed": "### 暫不主動提及的內容（{ai}記得，但最近提到太多次了，不要再主動提起）",
    },
    "ja": {
        "master": "## {master}について",
        "neko": "## {ai}について",
        "relationship": "## {master}と{ai}の関係",
        "other": "## {entity}について",
        "pending": "### {ai}の最近の印象（まだ確かではない）",
        "confirmed": "### {ai}のかなり確かな印象",
        "past_open": "======以下は少し前の記憶======\n以下は{ai}が以前に抱いた印象で、背景知識にすぎません。{master}から話題にしない限り、{ai}から持ち出したり尋ねたりしないこと。",
        "past_close": "======以上が少し前の記憶======",
        "suppressed": "### 自分からは持ち出さないこと（{ai}は覚えているが、最近話題にしすぎた）",
    },
    "ko": {
        "master": "## {master}에 대하여",
        "neko": "## {ai}에 대하여",
        "relationship": "## {master}와 {ai}의 관계",
        "other": "## {entity}에 대하여",
        "pending": "### {ai}의 최근 인상 (아직 확실하지 않음)",
        "confirmed": "### {ai}의 꽤 확실한 인상",
        "past_open": "======이하 예전 기억======\n아래는 {ai}가 예전에 가진 인상으로 배경 지식일 뿐입니다. {master}가 먼저 꺼내지 않는 한 {ai}는 먼저 꺼내거나 묻지 않습니다.",
        "past_close": "======이상 예전 기억======",
        "suppressed": "### 먼저 꺼내지 말 것 ({ai}는 기억하지만 최근에 너무 자주 언급함)",
    },
}

# (now, days, weeks, months) per language, the reference's time_since_label table.
RELATIVE: dict[str, tuple[str, str, str, str]] = {
    "zh": ("当下", "{n} 天前", "{n} 周前", "{n} 月前"),
    "zh-TW": ("當下", "{n} 天前", "{n} 週前", "{n} 個月前"),
    "ja": ("今", "{n} 日前", "{n} 週間前", "{n} ヶ月前"),
    "ko": ("지금", "{n}일 전", "{n}주 전", "{n}개월 전"),
}


def heading(language: str, key: str, **values: str) -> str | None:
    """The localised heading ``key`` in ``language``; None when English wording applies."""
    table = HEADINGS.get(language)
    return None if table is None else table[key].format(**values)


def relative(language: str, days: int) -> str | None:
    """The localised relative label of an age in days; None when English wording applies."""
    forms = RELATIVE.get(language)
    if forms is None:
        return None
    if days == 0:
        return forms[0]
    if days < 7:
        return forms[1].format(n=days)
    if days < 30:
        return forms[2].format(n=days // 7)
    return forms[3].format(n=max(1, days // 30))
