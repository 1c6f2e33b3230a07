"""Character names the reference chat server accepts round-trip through a real server.

The reference (``utils/character_name.py``, checked with ``allow_dots=True`` on every
memory-server request) allows letters and numbers of any script, space separators,
``_ - ( ) （ ） · ・ • ' ’`` and dots in names that already exist (a legacy ``.Carol``). Each
such name is written with ``/cache``, read back from ``/new_dialog`` and ``/query_memory``
and listed by the memory browser, over real HTTP, with the name URL-quoted the way the
reference's clients quote it. Path separators, ``..``, a lone ``.``, a trailing dot and
control characters stay refused, and a refusal writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from tests.support.live import LiveServer, make_settings

NAMES = ["Neko (cat)", "ミク・初音", "O'Brien", ".Carol", "猫（ねこ）", "Jean·Luc • 2", "O’Brien", "小\u3000八"]
REFUSED = ["a/b", "a\\b", "..", "a..b", ".", "neko.", "ne\x00ko", "ne\nko", "ne\u202eko", "CON", "nul.txt"]


def seg(name: str) -> str:
    """The path segment the reference's clients send (``urllib.parse.quote``, nothing safe)."""
    return quote(name, safe="")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("names")
    with LiveServer(make_settings(root, embedding_enabled=False)) as srv:
        yield srv, root


@pytest.mark.parametrize("name", NAMES)
def test_a_reference_name_round_trips(server, name: str) -> None:
    srv, root = server
    turn = f"plum tea note number {NAMES.index(name)}"  # no brackets: /new_dialog strips bracketed text
    history = {"input_history": [{"role": "user", "content": turn}, {"role": "assistant", "content": "noted"}]}
    cached = srv.post(f"/cache/{seg(name)}", json=history)
    assert cached.status_code == 200 and cached.json() == {"status": "cached", "count": 2}, cached.text
    assert (root / name / "recent.json").is_file()

    context = srv.get(f"/new_dialog/{seg(name)}")
    assert context.status_code == 200 and turn in context.text
    assert f"\n{name} | noted\n" in context.text  # the character speaks under its own name

    imported = srv.post(f"/api/characters/{seg(name)}/facts", json={"facts": [{"text": f"{name} drinks plum tea every evening"}]})
    assert imported.status_code == 200, imported.text
    found = srv.post(f"/query_memory/{seg(name)}", json={"query": "plum tea"})
    assert found.status_code == 200, found.text
    assert f"{name} drinks plum tea every evening" in found.text

    listed = {c["name"]: c for c in srv.get("/api/browse/characters").json()["characters"]}
    assert name in listed and listed[name]["turns"] == 2
    names = [c["name"] for c in srv.get("/api/characters").json()["characters"]]
    assert name in names


@pytest.mark.parametrize("name", REFUSED)
def test_unsafe_names_stay_refused_and_write_nothing(server, name: str) -> None:
    srv, root = server
    before = sorted(p.name for p in Path(root).iterdir())
    r = srv.post(f"/cache/{seg(name)}", json={"input_history": [{"role": "user", "content": "x"}]})
    # A name with a path separator may not reach the route at all (404): either way it is refused.
    assert r.status_code in (400, 404), r.text
    if r.status_code == 400:
        assert r.json()["error_code"] in ("name_invalid_chars", "name_reserved")
    assert sorted(p.name for p in Path(root).iterdir()) == before


def test_the_unit_limit_is_the_references(server) -> None:
    srv, _root = server
    ok = srv.post(f"/cache/{seg('猫' * 30)}", json={"input_history": [{"role": "user", "content": "x"}]})
    assert ok.status_code == 200
    too_long = srv.post(f"/cache/{seg('猫' * 30 + 'a')}", json={"input_history": [{"role": "user", "content": "x"}]})
    assert too_long.status_code == 400 and too_long.json()["error_code"] == "name_too_long"
