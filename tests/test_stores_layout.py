"""Character name rules and the memory-root layout."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from nekomem.stores.layout import (
    CharacterPaths,
    InvalidName,
    core_config_path,
    list_characters,
    validate_name,
)

ACCEPTED = [
    ("Lanlan", "Lanlan"),
    ("ねこ", "ねこ"),
    ("Лана", "Лана"),
    ("小八", "小八"),
    ("नेको", "नेको"),  # Devanagari needs its combining vowel signs
    ("N.E.K.O", "N.E.K.O"),
    ("neko_chan-2", "neko_chan-2"),
    ("  Neko Chan  ", "Neko Chan"),  # stripped
    ("a" * 50, "a" * 50),
    ("٣neko", "٣neko"),  # digits of any script
    ("console", "console"),  # only the exact device stem is reserved
    ("Nulla", "Nulla"),
    # What the reference accepts on a request (utils/character_name.py, allow_dots=True):
    ("Neko (cat)", "Neko (cat)"),
    ("ミク・初音", "ミク・初音"),
    ("O'Brien", "O'Brien"),
    ("O’Brien", "O’Brien"),
    ("猫（ねこ）", "猫（ねこ）"),
    ("Jean·Luc • 2", "Jean·Luc • 2"),
    (".Carol", ".Carol"),  # a legacy name with a leading dot
    ("a\u3000b", "a\u3000b"),  # any space separator
    ("Ⅷ½", "Ⅷ½"),  # numbers of any kind (str.isalnum)
    ("猫" * 30, "猫" * 30),  # 60 units
    ("a" * 50, "a" * 50),
]

REFUSED = [
    ("", "name_empty"),
    ("   ", "name_empty"),
    ("a" * 51, "name_too_long"),
    ("猫" * 31, "name_too_long"),  # 62 units: ASCII counts 1, every other character 2
    ("猫" * 30 + "a", "name_too_long"),
    ("../x", "name_invalid_chars"),
    ("a/b", "name_invalid_chars"),
    ("a\\b", "name_invalid_chars"),
    ("/etc", "name_invalid_chars"),
    ("a\x00b", "name_invalid_chars"),
    ("a\nb", "name_invalid_chars"),
    ("a\tb", "name_invalid_chars"),
    ("a\x7fb", "name_invalid_chars"),
    ("a\u202eb", "name_invalid_chars"),  # bidi override (format character)
    ("a\u200bb", "name_invalid_chars"),  # zero-width space
    ("a:b", "name_invalid_chars"),
    ("a*b", "name_invalid_chars"),
    ("neko😺", "name_invalid_chars"),
    ("a|b", "name_invalid_chars"),
    ("a<b>", "name_invalid_chars"),
    ('a"b', "name_invalid_chars"),
    ("a?b", "name_invalid_chars"),
    ("a@b", "name_invalid_chars"),
    ("a$b", "name_invalid_chars"),
    ("\u0301a", "name_invalid_chars"),  # a lone combining mark cannot start a name
    (".", "name_reserved"),
    ("..", "name_reserved"),
    ("...", "name_reserved"),
    ("a..b", "name_reserved"),  # '..' anywhere, as the reference
    (".nkatmp0123abcd.tmp", "name_reserved"),  # nekomem's temp files
    (".nekomem.lock", "name_reserved"),
    ("clock$", "name_invalid_chars"),
    ("neko.", "name_reserved"),
    ("CON", "name_reserved"),
    ("nul", "name_reserved"),
    ("Com1", "name_reserved"),
    ("lpt9", "name_reserved"),
    ("aux.txt", "name_reserved"),
    ("core_config.json", "name_reserved"),
]


@pytest.mark.parametrize(("raw", "expected"), ACCEPTED)
def test_accepted_names(raw: str, expected: str) -> None:
    assert validate_name(raw) == expected


@pytest.mark.parametrize(("raw", "code"), REFUSED)
def test_refused_names(raw: str, code: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_name(raw)
    assert caught.value.code == code
    assert caught.value.message


def test_max_length_is_a_parameter_and_counts_after_nfc() -> None:
    assert validate_name("a" * 60, max_length=60) == "a" * 60
    with pytest.raises(InvalidName):
        validate_name("abc", max_length=2)
    decomposed = unicodedata.normalize("NFD", "が" * 30)  # 60 code points, 30 (60 units) after NFC
    assert validate_name(decomposed) == "が" * 30
    assert validate_name("猫" * 40, max_units=80) == "猫" * 40


def test_message_does_not_echo_the_name() -> None:
    with pytest.raises(InvalidName) as caught:
        validate_name("secret/name")
    assert "secret" not in caught.value.message


def test_character_paths(tmp_path: Path) -> None:
    paths = CharacterPaths(tmp_path, " ねこ ")
    assert paths.name == "ねこ"
    folder = tmp_path / "ねこ"
    assert paths.folder == folder
    expected = {
        "recent": "recent.json",
        "recent_meta": "recent_meta.json",
        "time_index_db": "time_indexed.db",
        "facts": "facts.json",
        "facts_archive": "facts_archive.json",
        "reflections": "reflections.json",
        "surfaced": "surfaced.json",
        "reflection_archive_dir": "reflection_archive",
        "persona": "persona.json",
        "persona_corrections": "persona_corrections.json",
        "persona_archive_dir": "persona_archive",
        "outbox": "outbox.ndjson",
        "events": "events.ndjson",
        "events_applied": "events_applied.json",
        "cursors": "cursors.json",
        "state": "state.json",
    }
    for attribute, filename in expected.items():
        assert getattr(paths, attribute) == folder / filename
    assert not folder.exists()  # lazily created
    assert paths.ensure() == folder and folder.is_dir()
    assert paths.ensure() == folder
    assert core_config_path(tmp_path) == tmp_path / "core_config.json"


def test_character_paths_refuse_escaping_names(tmp_path: Path) -> None:
    with pytest.raises(InvalidName):
        CharacterPaths(tmp_path, "../outside")


def test_list_characters(tmp_path: Path) -> None:
    assert list_characters(tmp_path / "missing") == []
    for name in ("Лана", "Neko"):
        paths = CharacterPaths(tmp_path, name)
        paths.ensure()
        paths.recent.write_text("[]")
    (tmp_path / "Empty").mkdir()  # no known file
    (tmp_path / "Stray").mkdir()
    (tmp_path / "Stray" / "notes.txt").write_text("x")
    (tmp_path / "a..b").mkdir()  # invalid name
    (tmp_path / "a..b" / "recent.json").write_text("[]")
    (tmp_path / ".Carol").mkdir()  # a legacy dot name
    (tmp_path / ".Carol" / "recent.json").write_text("[]")
    (tmp_path / "core_config.json").write_text("{}")
    archive_only = CharacterPaths(tmp_path, "Old")
    archive_only.persona_archive_dir.mkdir(parents=True)
    assert list_characters(tmp_path) == [".Carol", "Neko", "Old", "Лана"]
