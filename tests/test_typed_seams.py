"""Typed from route to reply (issue 35): the seams between HTTP and the actors.

- Every ask of a route names its layer by a declared :data:`~nekomem.domain.layers.Address`
  constant, never a string, and names its answer as a reply Struct (or str/int/bool),
  never a dict, ``Any`` or the old ``JsonAnswer``. The calls are found by parsing
  ``nekomem/http/*.py`` (ast); the answer's name is then looked up in the imported module.
- The seams themselves (``runtime_access.ask``, ``CharacterRegistry.ask``/``tell``/
  ``ask_sync``, the registry entry's ``tell``, ``CharacterContext.send`` and
  ``Routes.live``) take ``child: Address``.
- Each layer's actor answers to the address its declaration gives it, and says so with
  the declared constant (a string literal there would pass at run time and drift).

The package parsed is the one imported (``nekomem.__file__``), so running this file with
another tree's ``src`` first on ``PYTHONPATH`` checks that tree.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

import nekomem
from nekomem.actors.supervisor import child_classes
from nekomem.domain.layers import layers

PACKAGE = Path(nekomem.__file__).resolve().parent

# (module, class or None, function): the seams whose ``child`` parameter must be an Address.
SEAMS = [
    ("http/runtime_access.py", None, "ask"),
    ("runtime/registry.py", "CharacterRegistry", "ask"),
    ("runtime/registry.py", "CharacterRegistry", "tell"),
    ("runtime/registry.py", "CharacterRegistry", "ask_sync"),
    ("runtime/registry.py", "_Entry", "tell"),
    ("runtime/services.py", "CharacterContext", "send"),
    ("runtime/services.py", "Routes", "live"),
]
PLAIN_ANSWERS = (str, int, bool)


def _tree(relative: str) -> ast.Module:
    path = PACKAGE / relative
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


# The asking helpers of the routes, and where their child and answer arguments are (a
# helper that fixes its layer has no child argument: None).
ASKERS = {"ask": (2, 4), "_ask": (None, 3)}


def _asks(tree: ast.Module) -> Iterator[tuple[ast.Call, ast.expr | None, ast.expr | None]]:
    """Each call of an asking helper in ``tree``, with its child and answer arguments (None
    when the call does not pass them positionally)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ASKERS:
            child_at, answer_at = ASKERS[node.func.id]
            child = node.args[child_at] if child_at is not None and len(node.args) > child_at else None
            answer = node.args[answer_at] if len(node.args) > answer_at else None
            yield node, child, answer


def _http_modules() -> list[str]:
    return sorted(f"http/{p.name}" for p in (PACKAGE / "http").glob("*.py"))


def test_every_route_asks_a_declared_address_for_a_reply_struct() -> None:
    problems: list[str] = []
    count = 0
    for relative in _http_modules():
        tree = _tree(relative)
        module = importlib.import_module("nekomem." + relative[:-3].replace("/", "."))
        for call, child, answer in _asks(tree):
            count += 1
            where = f"{relative}:{call.lineno}"
            if answer is None:
                problems.append(f"{where}: an ask without its answer type as an argument")
                continue
            if isinstance(child, ast.Constant) or (isinstance(child, ast.Call) and ast.unparse(child.func) == "Address"):
                problems.append(f"{where}: child address {ast.unparse(child)} is made here, not a declared Address")
            text = ast.unparse(answer)
            if isinstance(answer, ast.Subscript) or text in ("dict", "Any", "object", "JsonAnswer"):
                problems.append(f"{where}: answer {text} is not a reply Struct")
                continue
            value = getattr(module, text, None) if isinstance(answer, ast.Name) else None
            if isinstance(answer, ast.Name) and value is None:
                # A parameter passed on (theater's _ask, generic in its answer): its callers are
                # checked as calls of _ask.
                continue
            if not (isinstance(value, type) and (issubclass(value, msgspec.Struct) or value in PLAIN_ANSWERS)):
                problems.append(f"{where}: answer {text} is not a reply Struct (nor str/int/bool)")
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "JsonAnswer":
                problems.append(f"{relative}:{node.lineno}: JsonAnswer (a dict answer)")
    assert count >= 30, f"only {count} ask() calls found: is the parse still finding them?"
    assert problems == []


def _function(tree: ast.Module, cls: str | None, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    body: list[ast.stmt] = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return next(n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


@pytest.mark.parametrize(("relative", "cls", "name"), SEAMS, ids=[f"{c or m}.{f}" for m, c, f in SEAMS])
def test_the_seams_take_an_address(relative: str, cls: str | None, name: str) -> None:
    function = _function(_tree(relative), cls, name)
    child = next((a for a in function.args.args + function.args.kwonlyargs if a.arg == "child"), None)
    assert child is not None, f"{relative} {name} has no child parameter"
    assert child.annotation is not None and ast.unparse(child.annotation) == "Address", (
        f"{relative} {name}(child: {ast.unparse(child.annotation) if child.annotation else '?'}): not an Address"
    )
    returns = ast.unparse(function.returns) if function.returns is not None else ""
    assert "Any" not in returns and "dict" not in returns, f"{relative} {name} answers {returns}"


def test_each_actor_answers_to_its_declared_address() -> None:
    classes = child_classes()
    assert set(classes) == {spec.address for spec in layers()}
    for address, cls in classes.items():
        assert cls.child_name == address, f"{cls.__name__}.child_name is {cls.child_name!r}, declared {address!r}"


def test_each_actor_names_its_address_by_the_declared_constant() -> None:
    literal = []
    for path in sorted((PACKAGE / "layers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "child_name" for t in node.targets):
                if not isinstance(node.value, ast.Name):
                    literal.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: child_name = {ast.unparse(node.value)}")
    assert literal == []
