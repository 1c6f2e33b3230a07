"""ItemCache: per-item values of a window computed once per item."""

from __future__ import annotations

from nekomem.domain.turns import Turn
from nekomem.domain.window_cache import ItemCache


def turn(text: str) -> Turn:
    return Turn(role="human", text=text, ts="2026-12-01T10:00:00.000000+00:00")


def test_only_appended_or_unknown_items_are_computed() -> None:
    calls: list[str] = []

    def upper(t: Turn) -> str:
        calls.append(t.text)
        return t.text.upper()

    cache = ItemCache(upper)
    window = [turn("a"), turn("b")]
    assert cache.update(window) == (["A", "B"], 0)
    window.extend([turn("c")])  # extended in place: only the new item
    assert cache.update(window) == (["A", "B", "C"], 2)
    assert cache.update(window) == (["A", "B", "C"], 3)  # nothing new
    assert calls == ["a", "b", "c"]
    # A new list (a trim, an edit): known items by identity, the changed one computed.
    edited = [window[0], turn("b2"), window[2]]
    assert cache.update(edited) == (["A", "B2", "C"], 0)
    assert calls == ["a", "b", "c", "b2"]
    # An equal but new Turn object is computed again (identity, not equality).
    assert cache.update([turn("a")]) == (["A"], 0)
    assert calls[-1] == "a"
