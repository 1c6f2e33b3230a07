"""The dispatch table of actor messages: routes by exact type, subclass marks win, a
duplicate mark is refused at class creation, and patching a handler keeps its route."""

from __future__ import annotations

import pytest

from nekomem.actors.handlers import handler_for, handler_table, handles


class Ping:
    pass


class Pong:
    pass


class Base:
    @handles(Ping)
    def on_ping(self, msg: Ping) -> str:
        return "base ping"

    @handles(Pong)
    def on_pong(self, msg: Pong) -> str:
        return "base pong"


class Child(Base):
    @handles(Ping)
    def on_ping_again(self, msg: Ping) -> str:
        return "child ping"


def test_routes_by_type_and_the_subclass_wins():
    assert handler_for(Base(), Ping())(Ping()) == "base ping"
    assert handler_for(Child(), Ping())(Ping()) == "child ping"
    assert handler_for(Child(), Pong())(Pong()) == "base pong"
    assert handler_for(Child(), object()) is None
    assert handler_table(Child) == {Ping: "on_ping_again", Pong: "on_pong"}


def test_a_type_marked_twice_in_one_class_is_refused():
    # Python 3.11 wraps an error raised in __set_name__ in a RuntimeError (3.12 does not).
    with pytest.raises((TypeError, RuntimeError)) as caught:

        class Twice:
            @handles(Ping)
            def a(self, msg: Ping) -> None: ...

            @handles(Ping)
            def b(self, msg: Ping) -> None: ...

    assert "handles Ping twice" in f"{caught.value} {caught.value.__cause__}"


def test_a_patched_handler_keeps_its_route(monkeypatch):
    monkeypatch.setattr(Base, "on_pong", lambda self, msg: "patched")
    assert handler_for(Base(), Pong())(Pong()) == "patched"


def test_stacked_marks_route_several_types_to_one_method():
    class Both:
        @handles(Ping)
        @handles(Pong)
        def on_any(self, msg: object) -> str:
            return type(msg).__name__

    assert handler_for(Both(), Ping())(Ping()) == "Ping" and handler_for(Both(), Pong())(Pong()) == "Pong"
