"""Lexical tokens for recall: Latin/Cyrillic words, CJK character n-grams, Hangul words.

Text is NFKC-normalised and case-folded first (so full-width letters and digits, half-width
katakana and ``Ｒａｍｅｎ`` all meet their ordinary forms). Then it is cut into runs:

- a run of word characters that are not CJK or Hangul (Latin, Cyrillic, Greek, digits, ...)
  is one word; words shorter than ``recall_word_min_chars`` are dropped unless they are
  pure numbers; plain English plurals and possessives are folded (``cats`` -> ``cat``);
- a run of CJK ideographs and kana (Chinese and Japanese, which are written without
  spaces) is first cut where the script changes between ideographs, hiragana and
  katakana (``recall_cjk_split_scripts``: in Japanese that is nearly always a word
  boundary, a content word against its particle or okurigana; Chinese is all ideographs
  and stays whole); each piece becomes every character n-gram from
  ``recall_cjk_ngram_min`` to ``recall_cjk_ngram_max`` characters, sliding; a piece
  shorter than the minimum is one token. So ``昨日ラーメンを食べた`` gives ``昨日``,
  ``ラー``, ``ーメ``, ``メン``, ``ラーメ``, ``ーメン``, ``を``, ``食``, ``べた`` and the
  query ``ラーメン`` meets it on five of them;
- a run of Hangul is one word.

Repeats are kept (term frequency matters to BM25). Stop names (the master's and the
character's names and nicknames) are removed before tokenising, from documents and
queries alike, so that a name that appears in nearly every memory does not drown the rest.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

from nekomem.config.recall import RecallSettings

# Chinese/Japanese characters written without spaces: CJK ideographs (with extensions and
# compatibility forms), the ideographic iteration/closing marks, hiragana and katakana
# (the prolonged sound mark ー included, the katakana middle dot ・ excluded: it separates).
_CJK_RANGES = (
    "\u3005-\u3007"
    "\u3041-\u3096\u309d-\u309f"
    "\u30a1-\u30fa\u30fc-\u30ff"
    "\u31f0-\u31ff"
    "\u3400-\u4dbf"
    "\u4e00-\u9fff"
    "\uf900-\ufaff"
    "\U00020000-\U0003134f"
)
_HANGUL_RANGES = "\u1100-\u11ff\u3131-\u318e\uac00-\ud7a3"

# A word character that is neither CJK nor Hangul (nor the underscore).
_WORD_CLASS = f"[^\\W_{_CJK_RANGES}{_HANGUL_RANGES}]"
_RUN_RE = re.compile(f"(?P<cjk>[{_CJK_RANGES}]+)|(?P<hangul>[{_HANGUL_RANGES}]+)|(?P<word>{_WORD_CLASS}+)")
_HAS_SPACELESS_RE = re.compile(f"[{_CJK_RANGES}{_HANGUL_RANGES}]")
_ASCII_WORD_RE = re.compile(r"[a-z]+")
# _WORD_CLASS within ASCII after case folding: letters and digits.
_ASCII_RUN_RE = re.compile(r"[a-z0-9]+")
# A CJK run cut where the script changes: hiragana, katakana (ー included), everything else
# (ideographs and the iteration marks).
_HIRAGANA = "\u3041-\u3096\u309d-\u309f"
_KATAKANA = "\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff"
_SCRIPT_RE = re.compile(f"[{_HIRAGANA}]+|[{_KATAKANA}]+|[^{_HIRAGANA}{_KATAKANA}]+")


_DEFAULT_SETTINGS = RecallSettings()


def normalise(text: str) -> str:
    """NFKC-normalise and case-fold ``text`` (what both documents and queries go through)."""
    return unicodedata.normalize("NFKC", text).casefold()


@lru_cache(maxsize=1 << 16)  # a wake folds the same few thousand words many times
def fold_english(word: str) -> str:
    """Fold a plain English plural or possessive to its stem; other words are returned as is.

    Only lowercase ASCII words of four letters or more are touched, so ``bus``, ``gas``
    and ``this`` survive. ``stories`` -> ``story``, ``boxes`` -> ``box``, ``classes`` ->
    ``class``, ``cats`` -> ``cat``; ``glass``, ``virus`` and ``analysis`` are unchanged.
    """
    if len(word) < 4 or not _ASCII_WORD_RE.fullmatch(word):
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes", "zzes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@lru_cache(maxsize=64)
def _stop_name_pattern(names: tuple[str, ...], min_chars: int) -> re.Pattern[str] | None:
    """One alternation of the normalised stop names, longest first.

    Names containing CJK or Hangul are matched as plain substrings (those scripts have no
    word boundaries); other names only as whole words, so ``Ann`` does not eat ``annual``.
    """
    cleaned = sorted({n for n in (normalise(name).strip() for name in names) if len(n) >= min_chars}, key=lambda n: (-len(n), n))
    if not cleaned:
        return None
    parts = []
    for name in cleaned:
        escaped = re.escape(name)
        if _HAS_SPACELESS_RE.search(name):
            parts.append(escaped)
        else:
            parts.append(f"(?<!{_WORD_CLASS}){escaped}(?!{_WORD_CLASS})")
    return re.compile("|".join(parts))


def strip_stop_names(text: str, stop_names: Iterable[str], min_chars: int) -> str:
    """Replace every stop name in already-normalised ``text`` by a space."""
    pattern = _stop_name_pattern(tuple(sorted(set(stop_names))), min_chars)
    return text if pattern is None else pattern.sub(" ", text)


class Tokenizer:
    """The recall tokenizer configured from a settings section (see the module docstring)."""

    def __init__(self, settings: RecallSettings | None = None) -> None:
        s = settings or _DEFAULT_SETTINGS
        self._ngram_min = s.recall_cjk_ngram_min
        self._ngram_max = max(s.recall_cjk_ngram_max, s.recall_cjk_ngram_min)
        self._word_min = s.recall_word_min_chars
        self._fold = s.recall_fold_english_suffixes
        self._stop_min = s.recall_stop_name_min_chars
        self._split = s.recall_cjk_split_scripts

    def __call__(self, text: object, stop_names: Iterable[str] = ()) -> list[str]:
        """Tokens of ``text`` (repeats kept); ``None`` or non-string input is coerced, never raises."""
        if text is None:
            return []
        if not isinstance(text, str):
            text = str(text)
        norm = normalise(text)
        if stop_names:
            norm = strip_stop_names(norm, stop_names, self._stop_min)
        if norm.isascii():
            # Every run is a word (no CJK, no Hangul): one findall, the same tokens.
            word_min = self._word_min
            words = [w for w in _ASCII_RUN_RE.findall(norm) if len(w) >= word_min or w.isdigit()]
            return [fold_english(w) for w in words] if self._fold else words
        tokens: list[str] = []
        lo, hi = self._ngram_min, self._ngram_max
        for match in _RUN_RE.finditer(norm):
            kind = match.lastgroup
            run = match.group()
            if kind == "cjk":
                pieces = _SCRIPT_RE.findall(run) if self._split else [run]
                for piece in pieces:
                    length = len(piece)
                    if length < lo:
                        tokens.append(piece)
                        continue
                    for n in range(lo, min(hi, length) + 1):
                        tokens.extend(piece[i : i + n] for i in range(length - n + 1))
            elif kind == "hangul":
                tokens.append(run)
            else:
                if len(run) < self._word_min and not run.isdigit():
                    continue
                tokens.append(fold_english(run) if self._fold else run)
        return tokens

    def straddling(self, text: str, stop_names: Iterable[str] = ()) -> set[str]:
        """The CJK n-grams of ``text`` that may straddle two words: those shorter than a run
        the script split left whole (all of Chinese, a kanji-only or katakana-only run in
        Japanese, every run when the split is off). A piece the split cut out is taken as a
        word, and so is a run no longer than the n-gram it gives."""
        norm = normalise(text)
        if stop_names:
            norm = strip_stop_names(norm, stop_names, self._stop_min)
        out: set[str] = set()
        lo, hi = self._ngram_min, self._ngram_max
        for match in _RUN_RE.finditer(norm):
            run = match.group()
            if match.lastgroup != "cjk" or (self._split and len(_SCRIPT_RE.findall(run)) > 1):
                continue
            length = len(run)
            for n in range(lo, min(hi, length - 1) + 1):
                out.update(run[i : i + n] for i in range(length - n + 1))
        return out


_DEFAULT_TOKENIZER = Tokenizer()


def tokenize(text: str, stop_names: Iterable[str] = ()) -> list[str]:
    """Tokens of ``text`` with the default settings, stop names removed (see the module docstring)."""
    return _DEFAULT_TOKENIZER(text, stop_names)
