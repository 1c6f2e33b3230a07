"""Recent window: rendering, compression (map-reduce, stage-1/2), hard cap, splice, fingerprints."""

from __future__ import annotations

import random

import msgspec
import pytest

from nekomem.config.recent import RecentSettings
from nekomem.domain.prompts import recent as prompts_recent
from nekomem.domain.recent_window import (
    CompressResult,
    compress,
    compression_snapshot,
    cut_to_sentence_end,
    enforce_hard_cap,
    entry_matches,
    locate_fingerprint,
    needs_compression,
    render_lines,
    splice_memo,
    tail_fingerprint,
    window_tokens,
)
from nekomem.domain.tokens import HeuristicCounter, TiktokenCounter, TokenCounter, get_counter
from nekomem.domain.turns import Turn

MASTER, CHAR = "Master", "Neko"


@pytest.fixture(scope="module")
def counter() -> TiktokenCounter:
    c = get_counter("o200k_base")
    assert isinstance(c, TiktokenCounter)
    return c


def turn(role: str, text: str, i: int = 0) -> Turn:
    return Turn(role=role, text=text, ts=f"2024-05-01T10:{i // 60:02d}:{i % 60:02d}+00:00")  # type: ignore[arg-type]


def dialogue(n: int, words: int = 5) -> list[Turn]:
    return [turn("human" if i % 2 == 0 else "ai", f"message {i} " + " ".join(f"w{i}x{j}" for j in range(words)), i) for i in range(n)]


class FakeSummarizer:
    """Records every request and answers from a script (callable per call)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[list[dict[str, str]]] = []

    def __call__(self, messages: list[dict[str, str]]) -> str:
        self.calls.append(messages)
        return self.answer(len(self.calls), messages)

    @staticmethod
    def is_stage2(messages: list[dict[str, str]]) -> bool:
        return "Compress it further" in messages[0]["content"]


# --- rendering -------------------------------------------------------------------------


def test_render_lines_speakers_and_truncation(counter: TokenCounter) -> None:
    long_text = "start " + "filler " * 400 + "the end"
    turns = [turn("system", "Memo: earlier"), turn("human", "hi"), turn("ai", "hello"), turn("human", long_text)]
    lines = render_lines(turns, MASTER, CHAR, counter, 40, marker="<cut>")
    assert lines[:3] == ["system | Memo: earlier", "Master | hi", "Neko | hello"]
    body = lines[3].removeprefix("Master | ")
    assert "<cut>" in body and body.startswith("start") and body.endswith("the end")
    assert counter.count(body) <= 40


def test_window_tokens_counts_raw_text(counter: TokenCounter) -> None:
    turns = [turn("human", "hello world"), turn("ai", "Hello, world!")]
    assert window_tokens(turns, counter) == 6
    assert window_tokens([], counter) == 0


# --- compression -----------------------------------------------------------------------


def small_settings(**kw) -> RecentSettings:
    base = dict(
        recent_compress_input_budget_tokens=300,
        recent_per_message_max_tokens=60,
        recent_summary_max_tokens=60,
        recent_stage2_target_words=30,
    )
    base.update(kw)
    return RecentSettings(**base)


def test_compress_single_call(counter: TokenCounter) -> None:
    snap = dialogue(6)
    fake = FakeSummarizer(lambda n, m: "  They talked about words.  ")
    res = compress(snap, fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert isinstance(res, CompressResult)
    assert res.summary == "They talked about words."
    assert res.memo == Turn(role="system", text="Memo from prior conversations: They talked about words.", ts=snap[-1].ts)
    assert res.llm_calls == 1 and len(fake.calls) == 1
    assert res.used_stale_hint is False
    sent = fake.calls[0][1]["content"]
    assert sent.splitlines() == render_lines(snap, MASTER, CHAR, counter, 60)
    assert fake.calls[0][0]["role"] == "system"
    assert "JSON object only" in fake.calls[0][0]["content"]


def test_detailed_variant_differs(counter: TokenCounter) -> None:
    normal, detailed = FakeSummarizer(lambda n, m: "ok."), FakeSummarizer(lambda n, m: "ok.")
    compress(dialogue(4), normal, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None)
    compress(dialogue(4), detailed, small_settings(), counter, character_name=CHAR, detailed=True, stale_hours=None)
    assert normal.calls[0][0]["content"] != detailed.calls[0][0]["content"]
    assert "thorough" in detailed.calls[0][0]["content"]


@pytest.mark.parametrize(("hours", "expected"), [(None, False), (0.5, False), (1.0, True), (26.0, True)])
def test_stale_hint(counter: TokenCounter, hours: float | None, expected: bool) -> None:
    fake = FakeSummarizer(lambda n, m: "ok.")
    res = compress(dialogue(6), fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=hours)
    assert res is not None and res.used_stale_hint is expected
    content = fake.calls[0][1]["content"]
    assert ("hours ago" in content) is expected
    if expected:
        assert f"{hours:.1f} hours" in content


def _partial(tokens_wanted: int) -> str:
    # "Summary", then one " alpha" token each, then "." (exactly tokens_wanted in o200k).
    return "Summary " + " ".join("alpha" for _ in range(tokens_wanted - 2)) + "."


def test_map_reduce_properties(counter: TokenCounter) -> None:
    s = small_settings(recent_summary_max_tokens=250)
    snap = dialogue(80, words=12)
    lines = render_lines(snap, MASTER, CHAR, counter, s.recent_per_message_max_tokens)
    assert counter.count("\n".join(lines)) > s.recent_compress_input_budget_tokens
    part = _partial(100)
    assert counter.count(part) == 100
    fake = FakeSummarizer(lambda n, m: part)
    res = compress(snap, fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    assert res.llm_calls == len(fake.calls)
    inputs = [c[1]["content"] for c in fake.calls]
    # Every request stays within the input budget.
    assert all(counter.count(x) <= s.recent_compress_input_budget_tokens for x in inputs)
    # The map step: chunks of whole lines, in order, covering every line exactly once.
    map_inputs = [x for x in inputs if not x.startswith("Summary")]
    assert [ln for chunk in map_inputs for ln in chunk.split("\n")] == lines
    assert len(map_inputs) >= 2
    # Reduce rounds shrink the partial count each time; the final call sees the merged text.
    n_map = len(map_inputs)
    reduce_calls = len(inputs) - n_map - 1
    assert reduce_calls >= 1
    assert inputs[-1].startswith("Summary")
    # Partials of ~100 tokens pack two to a 300-token batch: n -> ceil(n/2) until <= budget.
    expected, n = 0, n_map
    while n > 1 and counter.count("\n\n".join([part] * n)) > 300:
        n = (n + 1) // 2
        expected += n
    assert reduce_calls == expected


def test_map_reduce_depth_limit_and_final_truncation(counter: TokenCounter) -> None:
    s = small_settings(recent_map_reduce_max_depth=1, recent_summary_max_tokens=250)
    snap = dialogue(120, words=12)
    part = _partial(100)
    fake = FakeSummarizer(lambda n, m: part)
    res = compress(snap, fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    inputs = [c[1]["content"] for c in fake.calls]
    n_map = sum(1 for x in inputs if not x.startswith("Summary"))
    # One reduce level only, then the final call on the truncated merge.
    assert len(inputs) == n_map + (n_map + 1) // 2 + 1
    assert counter.count(inputs[-1]) <= s.recent_compress_input_budget_tokens


def test_map_reduce_stops_when_batching_cannot_reduce(counter: TokenCounter) -> None:
    s = small_settings(recent_summary_max_tokens=250)
    snap = dialogue(40, words=12)
    big = _partial(200)  # two of these never fit one 300-token batch
    fake = FakeSummarizer(lambda n, m: big)
    res = compress(snap, fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    inputs = [c[1]["content"] for c in fake.calls]
    n_map = sum(1 for x in inputs if not x.startswith("Summary"))
    assert n_map >= 2
    assert len(inputs) == n_map + 1  # no reduce call at all
    assert counter.count(inputs[-1]) <= s.recent_compress_input_budget_tokens


def test_oversized_single_line_is_cut_to_budget(counter: TokenCounter) -> None:
    s = small_settings(recent_per_message_max_tokens=5000)
    snap = [turn("human", "giant " * 3000), turn("ai", "ok")]
    fake = FakeSummarizer(lambda n, m: "short.")
    res = compress(snap, fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    assert all(counter.count(c[1]["content"]) <= 300 for c in fake.calls)


def raise_on(*which: int):
    def answer(n: int, m: list[dict[str, str]]) -> str:
        if n in which:
            raise ConnectionError("boom")
        return "fine."

    return answer


@pytest.mark.parametrize("failing_call", [1, 2, 3])
def test_map_reduce_failure_returns_none(counter: TokenCounter, failing_call: int) -> None:
    fake = FakeSummarizer(raise_on(failing_call))
    res = compress(dialogue(80, words=12), fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is None
    assert len(fake.calls) == failing_call


def test_stage1_failure_returns_none(counter: TokenCounter) -> None:
    fake = FakeSummarizer(raise_on(1))
    assert compress(dialogue(5), fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None) is None
    empty = FakeSummarizer(lambda n, m: "   ")
    assert compress(dialogue(5), empty, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None) is None
    assert compress([], empty, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None) is None


LONG = " ".join(f"Point {i} is important." for i in range(60))  # well over 60 tokens


def test_stage2_compresses_and_cuts_to_sentence_end(counter: TokenCounter) -> None:
    def answer(n: int, m: list[dict[str, str]]) -> str:
        if FakeSummarizer.is_stage2(m):
            assert m[1]["content"] == LONG
            assert "about 30 words" in m[0]["content"]
            return "They met. They planned a trip。 and then the text was cut mid"
        return LONG

    fake = FakeSummarizer(answer)
    res = compress(dialogue(5), fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    assert res.summary == "They met. They planned a trip。"
    assert res.llm_calls == 2


def test_stage2_failure_retries_stage1(counter: TokenCounter) -> None:
    def answer(n: int, m: list[dict[str, str]]) -> str:
        if n == 1:
            return LONG
        if n == 2:
            raise TimeoutError
        return "Short summary."

    fake = FakeSummarizer(answer)
    res = compress(dialogue(5), fake, small_settings(), counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None and res.summary == "Short summary." and res.llm_calls == 3
    assert not FakeSummarizer.is_stage2(fake.calls[2])


def test_rounds_exhausted_cut_last_stage1(counter: TokenCounter) -> None:
    def answer(n: int, m: list[dict[str, str]]) -> str:
        if FakeSummarizer.is_stage2(m):
            raise ValueError("bad json")
        return LONG

    s = small_settings(recent_compress_max_rounds=2)
    fake = FakeSummarizer(answer)
    res = compress(dialogue(5), fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None
    assert res.llm_calls == 4
    assert counter.count(res.summary) <= s.recent_summary_max_tokens
    assert LONG.startswith(res.summary) and res.summary.endswith(".")


def test_stage2_still_too_long_is_cut(counter: TokenCounter) -> None:
    fake = FakeSummarizer(lambda n, m: LONG)
    s = small_settings()
    res = compress(dialogue(5), fake, s, counter, character_name=CHAR, detailed=False, stale_hours=None)
    assert res is not None and res.llm_calls == 2
    assert counter.count(res.summary) <= s.recent_summary_max_tokens
    assert res.summary.endswith(".")


def test_cut_to_sentence_end() -> None:
    marks = RecentSettings().recent_sentence_final_marks
    assert cut_to_sentence_end("A. B! C? tail", marks) == "A. B! C?"
    assert cut_to_sentence_end("今日は晴れ。明日は", marks) == "今日は晴れ。"
    assert cut_to_sentence_end("no mark at all", marks) == "no mark at all"
    assert cut_to_sentence_end("line one\nline two", marks) == "line one"


# --- thresholds and splice ---------------------------------------------------------------


def test_threshold_and_snapshot() -> None:
    s = RecentSettings()
    window = dialogue(21)
    assert not needs_compression(window[:20], s) and needs_compression(window, s)
    snap = compression_snapshot(window, s)
    assert snap == window[:12]
    memo = Turn(role="system", text="Memo from prior conversations: x", ts=snap[-1].ts)
    new = splice_memo(window, snap, memo)
    assert new is not None and len(new) == s.recent_history_max_items
    assert new[0] == memo and new[1:] == window[12:]
    assert compression_snapshot(window[:9], s) == []


def test_splice_is_compare_and_set() -> None:
    window = dialogue(21)
    snap = window[:12]
    memo = Turn(role="system", text="m")
    # Messages appended meanwhile are kept after the memo.
    grown = window + dialogue(3)
    assert splice_memo(grown, snap, memo) == [memo, *grown[12:]]
    # The head changed (edited, compressed or reviewed meanwhile): moot.
    edited = list(window)
    edited[3] = msgspec.structs.replace(edited[3], text="edited")
    assert splice_memo(edited, snap, memo) is None
    assert splice_memo([memo, *window[12:]], snap, memo) is None
    assert splice_memo(window[:5], snap, memo) is None
    assert splice_memo(window, [], memo) is None


# --- hard cap ----------------------------------------------------------------------------


def _check_cap(original: list[Turn], result: list[Turn], s: RecentSettings, c: TokenCounter) -> None:
    cap = s.recent_hard_cap_tokens
    assert window_tokens(result, c) <= cap
    if window_tokens(original, c) <= cap:
        assert result == original
        return
    has_memo = bool(original) and original[0].role == "system"
    raw = original[1:] if has_memo else original
    out_raw = result
    if has_memo and result and result[0].role == "system":
        assert original[0].text.startswith(result[0].text.partition(s.recent_truncation_marker)[0])
        out_raw = result[1:]
    assert all(t.role != "system" or (has_memo and i == 0) for i, t in enumerate(result)) or not has_memo
    # The raw part is a suffix of the original raw items, only its oldest one possibly cut.
    if raw:
        assert out_raw, "the newest item is always kept"
        suffix = raw[len(raw) - len(out_raw) :]
        assert out_raw[1:] == suffix[1:]
        first, orig_first = out_raw[0], suffix[0]
        assert (first.role, first.ts) == (orig_first.role, orig_first.ts)
        if first.text != orig_first.text:
            head, _, tail = first.text.partition(s.recent_truncation_marker)
            assert orig_first.text.startswith(head) and orig_first.text.endswith(tail)
            assert len(out_raw) <= s.recent_hard_cap_min_items


@pytest.mark.parametrize("which", ["o200k", "heuristic"])
def test_hard_cap_property(which: str, counter: TokenCounter) -> None:
    c: TokenCounter = counter if which == "o200k" else HeuristicCounter()
    rng = random.Random(2024)
    vocab = ["cat", "猫", "ねこ", "hello", "world", "。", "!", " ", "\n", "123", "😺"]
    for _case in range(300):
        cap = rng.choice([100, 150, 400, 1000])
        s = RecentSettings(
            recent_hard_cap_tokens=cap,
            recent_hard_cap_min_items=rng.randint(1, 12),
            recent_hard_cap_memo_share=rng.choice([0.0, 0.3, 0.5, 0.9]),
        )
        n = rng.randint(0, 40)
        window: list[Turn] = []
        if rng.random() < 0.5:
            memo_words = rng.choice([5, 50, 400, 3000])
            window.append(turn("system", "Memo: " + " ".join(rng.choices(vocab, k=memo_words))))
        for i in range(n):
            size = rng.choice([1, 5, 20, 80, 300]) if rng.random() > 0.03 else 8000  # sometimes giant
            window.append(turn(rng.choice(["human", "ai"]), "".join(rng.choices(vocab, k=size)), i))
        result = enforce_hard_cap(window, s, c)
        _check_cap(window, result, s, c)


def test_hard_cap_one_giant_message(counter: TokenCounter) -> None:
    s = RecentSettings(recent_hard_cap_tokens=1000)
    giant = turn("human", "START " + "data " * 50000 + " END", 99)
    memo = turn("system", "Memo from prior conversations: small memo.")
    window = [memo, *dialogue(5), giant]
    result = enforce_hard_cap(window, s, counter)
    assert window_tokens(result, counter) <= 1000
    assert result[0] == memo
    assert result[-1].ts == giant.ts and result[-1].text.startswith("START") and result[-1].text.endswith("END")
    assert s.recent_truncation_marker in result[-1].text
    # The giant message alone (no memo) also fits after the cut.
    alone = enforce_hard_cap([giant], s, counter)
    assert len(alone) == 1 and counter.count(alone[0].text) <= 1000


def test_hard_cap_giant_memo_yields_to_newest(counter: TokenCounter) -> None:
    s = RecentSettings(recent_hard_cap_tokens=1000, recent_hard_cap_memo_share=0.5)
    memo = turn("system", "Memo: " + "remember " * 5000)
    newest = turn("human", "latest " * 800, 5)  # 800 tokens
    result = enforce_hard_cap([memo, turn("ai", "older"), newest], s, counter)
    assert window_tokens(result, counter) <= 1000
    assert result[0].role == "system" and counter.count(result[0].text) <= 500
    assert result[-1].ts == newest.ts


def test_hard_cap_keeps_newest_whole_items_first(counter: TokenCounter) -> None:
    s = RecentSettings(recent_hard_cap_tokens=300, recent_hard_cap_min_items=10)
    items = [turn("human", "alpha " * 200, 0), turn("ai", "beta " * 200, 1), turn("human", "gamma " * 200, 2)]
    result = enforce_hard_cap(items, s, counter)
    assert len(result) == 2
    assert result[1] == items[2]
    assert result[0].ts == items[1].ts and s.recent_truncation_marker in result[0].text
    # With min_items 1 the second item is not cut in: only whole newest items beyond it.
    s1 = RecentSettings(recent_hard_cap_tokens=300, recent_hard_cap_min_items=1)
    assert enforce_hard_cap(items, s1, counter) == [items[2]]


def test_hard_cap_within_cap_is_identity(counter: TokenCounter) -> None:
    window = [turn("system", "Memo: m"), *dialogue(30)]
    assert enforce_hard_cap(window, RecentSettings(), counter) == window


# --- fingerprints ------------------------------------------------------------------------


def test_tail_fingerprint_and_locate() -> None:
    window = dialogue(10)
    fp = tail_fingerprint(window[:6], 3)
    assert len(fp) == 3
    role, digest, prefix = fp[-1].split(":", 2)
    assert role == window[5].role and len(digest) == 64 and prefix == window[5].text[:50]
    assert locate_fingerprint(window, fp) == 5
    assert locate_fingerprint(window[:5], fp) is None
    assert tail_fingerprint(window[:2], 3) == tail_fingerprint(window[:2], 5)
    assert len(tail_fingerprint(window[:2], 3)) == 2
    assert tail_fingerprint(window, 0) == []
    # Same prefix, different full text: the hash tells them apart.
    a = turn("human", "x" * 60 + "A")
    b = turn("human", "x" * 60 + "B")
    assert not entry_matches(tail_fingerprint([a], 1)[0], b)
    # Legacy prefix-only entry.
    assert entry_matches("human::" + "x" * 50, b)
    assert not entry_matches("ai::" + "x" * 50, b)


# --- output parsers ----------------------------------------------------------------------


def test_output_parsers() -> None:
    assert prompts_recent.summary_from_output({"summary": "  hi.  ", "extra": 1}) == "hi."
    assert prompts_recent.summary_from_output({"summary": {"a": "猫"}}) == '{"a": "猫"}'
    for bad in [{"summary": "  "}, {"summary": None}, {"other": "x"}, ["summary"], "summary"]:
        with pytest.raises(ValueError):
            prompts_recent.summary_from_output(bad)
    items = [{"role": "user", "content": "x"}]
    assert prompts_recent.corrected_from_output({"explanation": "", "corrected_dialogue": items}) == items
    with pytest.raises(ValueError):
        prompts_recent.corrected_from_output({"explanation": "none"})
