"""The key of the lexical near-duplicate check of facts.

Two facts that differ in a number, a negation or a name are different facts however many
words they share ("I have 2 cats" / "I have 3 cats", "Master likes tea" / "Master does not
like tea", "went hiking with Alice" / "went hiking with Bob"). The key therefore has two
parts:

- ``words``: the lexical keywords (:func:`nekomem.domain.facts.text_keywords`) plus every
  number, even a single digit, compared by Jaccard similarity;
- ``marks``: the numbers, negations and names of the text, which must be equal for a near
  duplicate at all.

So the lexical check only skips a fact that says the same thing in nearly the same words;
anything else is stored, and paraphrases are left to the vector candidates and the
``judge_duplicates`` model call (which without an answer changes nothing).
"""

from __future__ import annotations

import re

import msgspec

from nekomem.domain.facts import jaccard, text_keywords

# Digits (with decimal or thousands separators) and the CJK numeral characters.
_NUMBER = re.compile(r"\d+(?:[.,:/]\d+)*|[〇零一二两兩三四五六七八九十百千万萬億亿]")
_NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion "
    "first second third fourth fifth sixth seventh eighth ninth tenth once twice half dozen".split()
)
_LATIN_WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)
_NEGATION_WORDS = frozenset(
    "not no never none nobody nothing nowhere neither nor cannot without dont doesnt didnt isnt arent wasnt werent "
    "wont wouldnt cant couldnt shouldnt hasnt havent hadnt ne pas jamais nicht kein keine nie nunca nada".split()
)
# Negation markers of scripts without word breaks, found as substrings.
_NEGATION_MARKS = (
    "不",
    "没",
    "沒",
    "別",
    "别",
    "未",
    "无",
    "無",
    "非",
    "莫",
    "勿",
    "ない",
    "なかっ",
    "ません",
    "ず",
    "안",
    "않",
    "못",
    "없",
)
# Capitalised words that start sentences or are pronouns, not names.
_NOT_NAMES = frozenset(
    "the a an he she it they we you i his her its their our my your this that these those there here on in at by "
    "after before when while since during every each some all both".split()
)


class DedupKey(msgspec.Struct, frozen=True):
    """The lexical dedup key of one fact text (see the module docstring)."""

    words: frozenset[str]
    marks: frozenset[str]


def dedup_key(text: str) -> DedupKey:
    """The key of ``text``: keywords with numbers, and its numbers, negations and names."""
    numbers = set(_NUMBER.findall(text))
    marks = {"#" + n for n in numbers}
    for word in _LATIN_WORD.findall(text):
        folded = word.lower()
        bare = folded.replace("'", "")
        if bare in _NEGATION_WORDS or folded.endswith("n't"):
            marks.add("!" + bare)
        elif folded in _NUMBER_WORDS:
            marks.add("#" + folded)
        elif word[0].isupper() and folded not in _NOT_NAMES:
            marks.add("@" + folded)
    marks.update("!" + m for m in _NEGATION_MARKS if m in text)
    words = text_keywords(text) | {n.lower() for n in numbers}
    return DedupKey(words=frozenset(words), marks=frozenset(marks))


def marks_agree(a: DedupKey, b: DedupKey) -> bool:
    """True when ``a`` and ``b`` have the same numbers, negations and names. A mark only one
    side has still agrees when the other side has the same word (a name written in lower
    case there, "GREEN" beside "green")."""
    return all(mark[1:] in (b.words if mark in a.marks else a.words) for mark in a.marks ^ b.marks)


def near_duplicate(a: DedupKey, b: DedupKey, threshold: float) -> bool:
    """True when ``a`` and ``b`` have the same numbers, negations and names and their
    keywords reach ``threshold`` Jaccard similarity (never for an empty key)."""
    return bool(a.words) and marks_agree(a, b) and jaccard(set(a.words), set(b.words)) >= threshold
