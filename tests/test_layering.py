"""The import direction of the runtime: http -> actors -> runtime -> stores / domain /
recall / providers -> config. The runtime never imports the actors or the HTTP layer (the
app hands it the actors layer), so the two packages do not depend on each other."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "nekomem"
FORBIDDEN = {"runtime": ("nekomem.actors", "nekomem.http")}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (at any depth, including inside functions)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.extend([(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names])
    return found


def violations(package: str) -> list[str]:
    bad = []
    for path in sorted((SRC / package).rglob("*.py")):
        for line, module in imports_of(path):
            if module.startswith(FORBIDDEN[package]):
                bad.append(f"{path.relative_to(SRC)}:{line} imports {module}")
    return bad


def test_runtime_imports_neither_actors_nor_http() -> None:
    assert violations("runtime") == []


def test_the_check_catches_a_wrong_import(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.py"
    wrong.write_text("def f():\n    from nekomem.actors.supervisor import CharacterSupervisor\n", encoding="utf-8")
    assert [m for _l, m in imports_of(wrong) if m.startswith(FORBIDDEN["runtime"])]
