"""Offline token counting: exact o200k/cl100k counts, cutting guarantees, heuristic fallback."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nekomem.domain import tokens
from nekomem.domain.tokens import HeuristicCounter, TiktokenCounter, get_counter

SAMPLES = [
    "hello world",
    "Hello, world!",
    "I'm sure they'll say we've DONE it, didn't we?",
    "こんにちは、世界！今日はいい天気ですね。",
    "我喜欢猫。你呢？",
    "안녕하세요, 반갑습니다.",
    "Привет, как дела?",
    "numbers 1234567 and 3.14159, dates 2024-05-01T12:00:00+09:00",
    "  leading spaces\n\n\ttabs\r\nand CRLF   \n",
    "path/to/file.py // comment /* x */ <|endoftext|> stays text",
    "emoji 😺🐾 and combining é (e\u0301)",
    "",
]

MARKER = "…[middle omitted]…"


@pytest.fixture(scope="module")
def o200k() -> TiktokenCounter:
    counter = get_counter("o200k_base")
    assert isinstance(counter, TiktokenCounter)
    return counter


@pytest.fixture(scope="module")
def cl100k() -> TiktokenCounter:
    counter = get_counter("cl100k_base")
    assert isinstance(counter, TiktokenCounter)
    return counter


def test_o200k_known_counts(o200k: TiktokenCounter) -> None:
    # Token ids published in tiktoken's own test suite / docs for o200k_base.
    assert o200k.encode("hello world") == [24912, 2375]
    assert o200k.count("hello world") == 2
    # "Hello" "," " world" "!"
    assert o200k.count("Hello, world!") == 4
    assert o200k.count("") == 0


def test_cl100k_known_counts(cl100k: TiktokenCounter) -> None:
    # Ids from tiktoken's README example.
    assert cl100k.encode("hello world") == [15339, 1917]
    assert cl100k.count("Hello, world!") == 4


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_matches_independent_implementation(name: str) -> None:
    """puretiktoken is a separate pure-Python implementation of the same encodings: the
    regex pattern written here must split text exactly like the published one."""
    import puretiktoken

    ours = get_counter(name)
    assert isinstance(ours, TiktokenCounter)
    reference = puretiktoken.get_encoding(name)
    rng = random.Random(7)
    pool = "".join(SAMPLES)
    texts = list(SAMPLES) + ["".join(rng.choice(pool) for _ in range(rng.randint(1, 200))) for _ in range(200)]
    for text in texts:
        assert ours.encode(text) == reference.encode_ordinary(text), repr(text)


def test_counter_is_cached() -> None:
    assert get_counter("o200k_base") is get_counter("o200k_base")


def test_unknown_encoding_is_an_error() -> None:
    with pytest.raises(ValueError):
        get_counter("p50k_nonexistent")


def test_no_network_and_no_tiktoken_registry(tmp_path: Path) -> None:
    """In a fresh interpreter with every socket call failing and an empty tiktoken cache,
    both encodings load, count right, and tiktoken's download registry is never used."""
    cache = tmp_path / "tiktoken-cache"
    cache.mkdir()
    script = textwrap.dedent(
        """
        import json, socket

        def refuse(*args, **kwargs):
            raise RuntimeError("network access attempted")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse

        from nekomem.domain.tokens import get_counter, TiktokenCounter
        import tiktoken.registry

        out = {}
        for name in ("o200k_base", "cl100k_base"):
            c = get_counter(name)
            out[name] = [type(c).__name__, c.count("hello world"), c.count("Hello, world!")]
        out["registry"] = sorted(tiktoken.registry.ENCODINGS)
        print(json.dumps(out))
        """
    )
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache), DATA_GYM_CACHE_DIR=str(cache))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["o200k_base"] == ["TiktokenCounter", 2, 4]
    assert out["cl100k_base"] == ["TiktokenCounter", 2, 4]
    assert out["registry"] == []
    assert list(cache.iterdir()) == []
    assert "network access attempted" not in proc.stderr


def _random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    pool = "".join(SAMPLES) + "日本語の文章です。" * 3
    return ["".join(rng.choice(pool) for _ in range(rng.randint(0, 600))) for _ in range(n)]


@pytest.mark.parametrize("which", ["o200k", "heuristic"])
def test_truncate_and_head_tail_never_exceed(which: str, o200k: TiktokenCounter) -> None:
    counter = o200k if which == "o200k" else HeuristicCounter()
    rng = random.Random(11)
    for text in _random_texts(3, 150):
        limit = rng.randint(0, 120)
        cut = counter.truncate(text, limit)
        assert counter.count(cut) <= max(limit, 0)
        assert text.startswith(cut)
        tail = counter.truncate_tail(text, limit)
        assert counter.count(tail) <= max(limit, 0)
        assert text.endswith(tail)
        ht = counter.head_tail(text, limit, MARKER)
        assert counter.count(ht) <= max(limit, 0)
        if counter.count(text) <= limit:
            assert ht == text and cut == text
        elif MARKER in ht:
            head, _, rest = ht.partition(MARKER)
            assert text.startswith(head)
            assert text.endswith(rest)


def test_head_tail_shape(o200k: TiktokenCounter) -> None:
    text = "".join(f"sentence number {i}. " for i in range(200))
    out = o200k.head_tail(text, 100, MARKER)
    head, _, tail = out.partition(MARKER)
    assert head and tail
    assert text.startswith(head) and text.endswith(tail)
    # The tail gets half of the allowance; the marker's tokens come out of the head's half.
    assert o200k.count(tail) <= 50
    assert o200k.count(head) <= 50 - o200k.count(MARKER)
    assert o200k.count(head) >= 50 - o200k.count(MARKER) - 3
    assert o200k.count(tail) >= 47


def test_head_tail_with_marker_larger_than_budget(o200k: TiktokenCounter) -> None:
    text = "word " * 100
    out = o200k.head_tail(text, 4, MARKER * 3)
    assert MARKER not in out
    assert out == o200k.truncate(text, 4)


def test_multibyte_cut_never_breaks_characters(o200k: TiktokenCounter) -> None:
    text = "😺🐾猫" * 40
    for limit in range(1, 30):
        cut = o200k.truncate(text, limit)
        assert "\ufffd" not in cut
        assert text.startswith(cut)


def test_heuristic_counts() -> None:
    h = HeuristicCounter()
    assert h.count("") == 0
    assert h.count("a") == 1  # minimum 1
    assert h.count("abcd") == 1
    assert h.count("abcde") == 2  # 1.25 rounded up
    assert h.count("日本") == 3
    assert h.count("日本語") == 5  # 4.5 rounded up
    assert h.count("猫cat") == 3  # 1.5 + 0.75


def _reset_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokens, "_warned", False)
    monkeypatch.setattr(tokens, "_counters", {})


def test_fallback_on_corrupt_vocabulary_warns_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pkg = tmp_path / "fakevocab_pkg"
    (pkg / "data").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "bad.tiktoken").write_bytes(b"aGVsbG8= 0\n")  # wrong sha256
    monkeypatch.syspath_prepend(str(tmp_path))
    _reset_fallback(monkeypatch)
    spec_bad = tokens._EncodingSpec(tokens.O200K_PATTERN, {}, "0" * 64, [("fakevocab_pkg", "data/bad.tiktoken")])
    spec_missing = tokens._EncodingSpec(tokens.O200K_PATTERN, {}, "0" * 64, [("no_such_pkg_xyz", "data/x.tiktoken")])
    monkeypatch.setitem(tokens._SPECS, "bad_base", spec_bad)
    monkeypatch.setitem(tokens._SPECS, "missing_base", spec_missing)
    with pytest.raises(tokens.VocabularyError, match="sha256 mismatch"):
        tokens.load_encoding("bad_base")
    with caplog.at_level(logging.WARNING, logger="nekomem.domain.tokens"):
        first = get_counter("bad_base")
        second = get_counter("missing_base")
    assert isinstance(first, HeuristicCounter) and isinstance(second, HeuristicCounter)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert first.count("日本語") == 5
