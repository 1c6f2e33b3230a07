"""Rules of the house that a reader should not have to check by hand: actors compose
rather than inherit, nothing in actors/ or layers/ silences the type checker, and no attribute is
read with a default that __init__ should have set."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import nekomem
import nekomem.actors
import nekomem.layers
from nekomem.actors.base import ChildActor

SRC = Path(nekomem.__file__).parent
# pykka's own classes, the standard library's and msgspec's are the framework a class
# stands on, not the project's layering of it.
FRAMEWORK = ("pykka", "abc", "builtins", "typing", "msgspec")


def actor_classes() -> list[type]:
    """Every class defined in the actor plumbing (actors/) and in the layers' folders (layers/)."""
    found = []
    for package in (nekomem.actors, nekomem.layers):
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            module = importlib.import_module(info.name)
            found += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    return found


def project_bases(cls: type) -> list[type]:
    return [k for k in cls.__mro__[1:] if k is not ChildActor and k.__module__.split(".")[0] not in FRAMEWORK]


def test_no_class_in_actors_stands_on_more_than_three_project_bases() -> None:
    classes = actor_classes()
    assert len(classes) > 20  # the walk found the package
    deep = {c.__qualname__: [k.__name__ for k in project_bases(c)] for c in classes if len(project_bases(c)) > 3}
    assert deep == {}


def test_every_child_actor_is_a_mailbox_over_a_layer_object() -> None:
    actors = [c for c in actor_classes() if issubclass(c, ChildActor) and c is not ChildActor]
    assert len(actors) == 6
    for actor in actors:
        assert actor.__mro__[1] is ChildActor, actor
        assert "make_layer" in vars(actor), actor
        own = {name for name, value in vars(actor).items() if inspect.isfunction(value)}
        assert own == {"make_layer"}, (actor, own)


def test_actors_do_not_silence_the_type_checker() -> None:
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in [*(SRC / "actors").glob("*.py"), *(SRC / "layers").rglob("*.py")]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert hits == []


def test_no_attribute_of_self_is_read_with_a_default() -> None:
    pattern = re.compile(r"getattr\(self,\s*[^,()]+,")
    hits = [
        f"{p.relative_to(SRC)}:{n}"
        for p in SRC.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_the_checks_see_what_they_forbid(tmp_path: Path) -> None:
    class A: ...

    class B(A): ...

    class C(B): ...

    class D(C): ...

    class E(D): ...

    assert len(project_bases(E)) == 4
    assert re.search(r"getattr\(self,\s*[^,()]+,", 'x = getattr(self, "_dirty", 0)')
