"""How a theater capsule reads in the working context (see :mod:`nekomem.domain.theater`).

The reference renders a capsule as a note that the character remembers performing the
story with the master, marked as fiction, with the run number, the story's run count and
endings when played more than once, and the episode's state (paused, or completed with
its ending) and summary. The wording here is nekomem's own; languages without a table
entry fall back to English (:func:`nekomem.domain.locale.context.text`).
"""

from __future__ import annotations

from nekomem.domain.locale import context as loc

_INTRO = {
    "en": "{name} remembers playing the theater story {title} together with {master}. It was a fictional performance, not something that really happened.",
    "zh": "{name}记得和{master}一起演过小剧场{title}。那是虚构的剧情演绎，并非真实经历。",
    "zh-TW": "{name}記得和{master}一起演過小劇場{title}。那是虛構的劇情演繹，並非真實經歷。",
    "ja": "{name}は{master}と一緒に小劇場{title}を演じたことを覚えています。それは架空の演目で、現実の出来事ではありません。",
}
_RUN = {
    "en": "It was performance number {run_index} of this story.",
    "zh": "这是第 {run_index} 次演这个剧本。",
    "zh-TW": "這是第 {run_index} 次演這個劇本。",
    "ja": "この物語を演じるのは {run_index} 回目でした。",
}
_COUNT = {
    "en": "They have performed this story {count} times so far.",
    "zh": "到目前为止一共演了这个剧本 {count} 次。",
    "zh-TW": "到目前為止一共演了這個劇本 {count} 次。",
    "ja": "これまでにこの物語を {count} 回演じています。",
}
_COUNT_ENDINGS = {
    "en": "They have performed this story {count} times so far; endings reached: {endings}.",
    "zh": "到目前为止一共演了这个剧本 {count} 次；达成过的结局：{endings}。",
    "zh-TW": "到目前為止一共演了這個劇本 {count} 次；達成過的結局：{endings}。",
    "ja": "これまでにこの物語を {count} 回演じ、到達した結末は{endings}です。",
}
_PAUSED = {
    "en": "The performance stopped before the story ended and can be resumed where it left off.",
    "zh": "这次演绎在剧情结束前暂停了，之后可以从原来的进度继续。",
    "zh-TW": "這次演繹在劇情結束前暫停了，之後可以從原來的進度繼續。",
    "ja": "この演目は物語の途中で止まっていて、続きから再開できます。",
}
_DONE = {
    "en": "The performance was completed with the ending “{ending}”. {summary}",
    "zh": "这次演绎已经完成，结局是《{ending}》。{summary}",
    "zh-TW": "這次演繹已經完成，結局是《{ending}》。{summary}",
    "ja": "この演目は結末『{ending}』で完結しました。{summary}",
}
_DONE_UNTITLED = {
    "en": "The performance was completed. {summary}",
    "zh": "这次演绎已经完成。{summary}",
    "zh-TW": "這次演繹已經完成。{summary}",
    "ja": "この演目は完結しました。{summary}",
}
_TITLE_MARKS = (("《", "》"), ("〈", "〉"), ("『", "』"), ("「", "」"), ("“", "”"), ("«", "»"), ("‹", "›"), ('"', '"'))
_TITLE_WRAP = {"zh": ("《", "》"), "zh-TW": ("《", "》"), "ja": ("『", "』"), "ko": ("《", "》"), "ru": ("«", "»"), "es": ("«", "»")}


def _title(title: str, language: str) -> str:
    """The title in the language's quotation marks, unless it already has a pair."""
    title = title.strip()
    if not title or any(title.startswith(a) and title.endswith(b) for a, b in _TITLE_MARKS):
        return title
    left, right = _TITLE_WRAP.get(language, ("“", "”"))
    return f"{left}{title}{right}"


def capsule_text(
    *,
    language: str,
    name: str,
    master: str,
    title: str,
    status: str,
    ending: str,
    summary: str,
    run_index: int,
    story_run_count: int,
    ending_titles: list[str],
) -> str:
    """The context note for one capsule (parts left out when their data is missing)."""
    parts = [loc.text(_INTRO, language, name=name, master=master, title=_title(title, language))]
    if run_index > 0:
        parts.append(loc.text(_RUN, language, run_index=run_index))
    if story_run_count > 1:
        endings = [e.strip() for e in ending_titles if e.strip()]
        if endings:
            sep = "、" if language in ("zh", "zh-TW", "ja") else ", "
            parts.append(loc.text(_COUNT_ENDINGS, language, count=story_run_count, endings=sep.join(dict.fromkeys(endings))))
        else:
            parts.append(loc.text(_COUNT, language, count=story_run_count))
    if status == "completed":
        table = _DONE if ending else _DONE_UNTITLED
        parts.append(loc.text(table, language, ending=ending, summary=summary).strip())
    else:
        parts.append(f"{loc.text(_PAUSED, language)} {summary}".strip())
    return "\n".join(p for p in parts if p).strip()
