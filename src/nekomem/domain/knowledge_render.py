"""The fenced reference block a public-knowledge lookup hands the model, and the excerpt
of an entry that matched.

Every piece of pack text goes through :func:`safe_line` (one line, the fence markers and
chat-role markup taken out), so a card can neither close the block early nor speak as a
chat role. Labels follow the caller's language (zh, ja, en; other languages get en).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import msgspec

SUMMARY_CHARS = 300
CONTENT_CHARS = 900
LINE_CHARS = 120
PASSAGE_CHARS = 400

_LABELS: dict[str, dict[str, str]] = {
    "zh": {
        "begin": "[公共知识参考·开始]",
        "end": "[公共知识参考·结束]",
        "note": "以下是本地公共知识包中的资料，仅供参考，不是用户或角色的记忆。",
        "knowledge": "知识",
        "corpus": "语料",
        "summary": "摘要",
        "content": "内容",
        "source": "来源",
        "license": "许可",
    },
    "ja": {
        "begin": "[公開知識の参考・開始]",
        "end": "[公開知識の参考・終了]",
        "note": "以下はローカルの公開知識パックの資料で、参考情報です。ユーザーやキャラクターの記憶ではありません。",
        "knowledge": "知識",
        "corpus": "コーパス",
        "summary": "要約",
        "content": "内容",
        "source": "出典",
        "license": "ライセンス",
    },
    "en": {
        "begin": "[Public knowledge reference: begin]",
        "end": "[Public knowledge reference: end]",
        "note": "Material from local public knowledge packs, for reference only; not a memory of the user or the character.",
        "knowledge": "knowledge",
        "corpus": "corpus",
        "summary": "Summary",
        "content": "Content",
        "source": "Source",
        "license": "License",
    },
}
_MARKERS = tuple(text for labels in _LABELS.values() for text in (labels["begin"], labels["end"]))
_CHAT_MARKUP = re.compile(r"<\|[^|>]{0,40}\|>|</?(?:system|assistant|user)>", re.IGNORECASE)


class Card(msgspec.Struct, frozen=True):
    title: str
    material_type: str
    summary: str
    content: str
    source_name: str
    source_license: str


def language_of(language: str | None) -> str:
    code = (language or "").strip().lower().replace("_", "-")
    if code.startswith("zh"):
        return "zh"
    if code.startswith("ja"):
        return "ja"
    return "en"


def safe_line(text: str, max_chars: int) -> str:
    """``text`` on one line, without chat markup or fence markers, cut to ``max_chars``."""
    previous = None
    while previous != text:  # to a fixed point: removing one marker may join another
        previous = text
        text = _CHAT_MARKUP.sub("", text)
        for marker in _MARKERS:
            text = text.replace(marker, "")
    line = " ".join(text.split())
    return line if len(line) <= max_chars else line[: max_chars - 1].rstrip() + "…"


def passages(content: str) -> list[str]:
    """The content cut into passages of about PASSAGE_CHARS (at paragraph breaks when it can)."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", content):
        para = para.strip()
        while len(para) > PASSAGE_CHARS:
            out.append(para[:PASSAGE_CHARS])
            para = para[PASSAGE_CHARS:]
        if para:
            out.append(para)
    return out or [content]


def best_excerpt(content: str, query_terms: Callable[[str], set[str]], query: str) -> str:
    """The passage of ``content`` sharing most terms with ``query`` (the first on ties),
    marked with a leading ellipsis when it is not the first."""
    parts = passages(content)
    wanted = query_terms(query) if query else set()
    if not wanted or len(parts) == 1:
        return parts[0]
    scores = [len(wanted & query_terms(part)) for part in parts]
    index = max(range(len(parts)), key=lambda i: (scores[i], -i))
    return parts[index] if index == 0 else "… " + parts[index]


def render_block(cards: Sequence[Card], language: str | None) -> str:
    """The fenced block, or "" when there is no card."""
    if not cards:
        return ""
    labels = _LABELS[language_of(language)]
    lines = [labels["begin"], labels["note"]]
    for card in cards:
        kind = labels.get(card.material_type, labels["knowledge"])
        lines += ["", f"- [{safe_line(card.title, LINE_CHARS)}] ({kind})"]
        summary = safe_line(card.summary, SUMMARY_CHARS)
        if summary:
            lines.append(f"  {labels['summary']}: {summary}")
        content = safe_line(card.content, CONTENT_CHARS)
        if content:
            lines.append(f"  {labels['content']}: {content}")
        provenance = f"  {labels['source']}: {safe_line(card.source_name, LINE_CHARS)}"
        licence = safe_line(card.source_license, LINE_CHARS)
        if licence:
            provenance += f" | {labels['license']}: {licence}"
        lines.append(provenance)
    lines.append(labels["end"])
    return "\n".join(lines)
