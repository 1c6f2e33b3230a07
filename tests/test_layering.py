"""The import direction of the house: http -> actors -> runtime -> stores / domain / recall /
providers -> config. Every module under src/nekomem is parsed (ast, nothing imported) and
each of its imports of another nekomem package must point down (or inside its own layer).
Top-level modules (__main__) sit above every layer."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "nekomem"

# Higher number = higher layer. Packages of one layer may import each other.
LAYERS: dict[str, int] = {
    "config": 0,
    "wire": 0,  # the answers in their wire shape (msgspec only): layers build them, the client reads them
    "stores": 1,
    "domain": 1,
    "recall": 1,
    "models": 1,  # the user's and the bundled models: the LLM client, embeddings, the re-ranker
    "importer": 1,  # reads a reference memory folder, writes through stores/
    "runtime": 2,
    "cluster": 2,  # shard ownership in etcd, fencing, moves: beside the runtime it drives
    "actors": 3,  # the actor plumbing every layer shares
    "layers": 3,  # one folder per layer: its actor, layer object and parts
    "http": 4,
    "ui": 4,  # the memory browser's static page, served by http/
    "client": 4,  # the Python client: a leaf over the wire types (see LEAVES)
    "mcp": 4,  # the MCP tools over the client, mounted by the app
    "server": 5,  # the roof: the app's assembly, OpenAPI, binding and start-up
    "cli": 5,  # the commands
    # The cluster is one room holding code of several layers; each module says its own.
    "cluster.routes": 4,
    "cluster.forward": 4,
    "cluster.hop_pool": 4,
    "cluster.schemas": 4,
    "cluster.cli": 5,
}
# A layer's declaration (layers/<name>/declaration.py) is plain data that the rooms below
# the layers read (nekomem.domain.layers loads it by name): it stays at their level.
LAYERS |= {f"layers.{path.parent.name}.declaration": 1 for path in SRC.glob("layers/*/declaration.py")}
# Packages that may import only these nekomem modules (and themselves): the client is
# usable without the server's layers, and the MCP tools reach the server only through it.
LEAVES: dict[str, tuple[str, ...]] = {
    "client": ("nekomem.http.schemas",),
    "mcp": ("nekomem.client",),
}
# Packages of one layer that a package must not import: recall reads the domain, never the
# other way (what both need, IndexEntry and vector_codec, lives in domain).
BESIDE: dict[str, tuple[str, ...]] = {"domain": ("recall",)}
TOP = 5  # __main__.py and anything undeclared: may import anything
ROOT = 0  # nekomem/__init__.py (the version): importable from everywhere, imports nothing


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    if len(parts) < 2:
        return ROOT
    # The longest declared name that the module is, or lies under, decides.
    for end in range(len(parts), 1, -1):
        layer = LAYERS.get(".".join(parts[1:end]))
        if layer is not None:
            return layer
    return TOP


def imports_of(path: Path, src: Path = SRC) -> list[tuple[int, str]]:
    """(line, imported nekomem module) for every import in the file, wherever it appears
    (function-level imports count: they are edges too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("nekomem")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("nekomem"):
                # "from nekomem.domain import refine" names a submodule: judge by the package.
                found.append((node.lineno, target))
    return found


def violations(src: Path = SRC) -> list[str]:
    """Every import under ``src`` that goes up a layer, as ``file:line: what``."""
    problems: list[str] = []
    for path in sorted(src.rglob("*.py")):
        source = module_name(path, src)
        for line, target in imports_of(path, src):
            if layer_of(target) > layer_of(source):
                where = path.relative_to(src.parent)
                problems.append(f"{where}:{line}: {source} imports {target} (layer {layer_of(target)} > {layer_of(source)})")
    return problems


def beside_violations(src: Path = SRC) -> list[str]:
    """Every import of a package of the same layer that ``BESIDE`` forbids."""
    problems: list[str] = []
    for package, forbidden in BESIDE.items():
        for path in sorted((src / package).rglob("*.py")):
            for line, target in imports_of(path, src):
                if any(target == f"nekomem.{f}" or target.startswith(f"nekomem.{f}.") for f in forbidden):
                    problems.append(f"{path.relative_to(src.parent)}:{line}: {module_name(path, src)} imports {target}")
    return problems


def test_the_domain_does_not_import_recall():
    assert beside_violations() == []


def test_a_domain_import_of_recall_is_caught(tmp_path):
    fake = tmp_path / "nekomem"
    for package in ("domain", "recall"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "domain" / "views.py").write_text("from nekomem.recall.entry import X\nfrom nekomem.domain import views\n")
    (fake / "domain" / "late.py").write_text("def f():\n    from nekomem.recall import vector_codec\n")
    (fake / "recall" / "index.py").write_text("from nekomem.domain.index_entry import IndexEntry\n")
    assert beside_violations(fake) == [
        "nekomem/domain/late.py:2: nekomem.domain.late imports nekomem.recall",
        "nekomem/domain/views.py:1: nekomem.domain.views imports nekomem.recall.entry",
    ]


def leaf_violations(src: Path = SRC) -> list[str]:
    """Every import of a leaf package (``LEAVES``) outside what it may import."""
    problems: list[str] = []
    for package, allowed in LEAVES.items():
        own = f"nekomem.{package}"
        for path in sorted((src / package).rglob("*.py")):
            for line, target in imports_of(path, src):
                ok = target == "nekomem" or any(target == a or target.startswith(a + ".") for a in (own, *allowed))
                if not ok:
                    problems.append(f"{path.relative_to(src.parent)}:{line}: {module_name(path, src)} imports {target}")
    return problems


def test_the_client_and_the_mcp_tools_are_leaves():
    assert leaf_violations() == []


def test_a_leaf_reaching_into_the_server_is_caught(tmp_path):
    fake = tmp_path / "nekomem"
    for package in ("client", "mcp"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "client" / "aio.py").write_text("from nekomem.http.schemas import WriteAnswer\nfrom nekomem.runtime.reply import Reply\n")
    (fake / "mcp" / "tools.py").write_text(
        "from nekomem import __version__\nfrom nekomem.client import X\nfrom nekomem.server.app import create_app\n"
    )
    assert leaf_violations(fake) == [
        "nekomem/client/aio.py:2: nekomem.client.aio imports nekomem.runtime.reply",
        "nekomem/mcp/tools.py:3: nekomem.mcp.tools imports nekomem.server.app",
    ]


def test_every_package_has_a_layer():
    packages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(LAYERS), f"packages without a layer: {sorted(packages - set(LAYERS))}"


def test_imports_point_down():
    assert violations() == []


def test_a_wrong_import_is_caught(tmp_path):
    """The checker itself: a domain module importing an actor module is reported, and so
    is a function-level import of the runtime from a store."""
    fake = tmp_path / "nekomem"
    for package in ("domain", "stores", "actors"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "domain" / "bad.py").write_text("from nekomem.layers.recall.layer import RecallActor\n")
    (fake / "stores" / "late.py").write_text("def f():\n    from nekomem.runtime import pool\n")
    (fake / "actors" / "fine.py").write_text("from nekomem.domain import bad\nfrom . import fine\n")
    assert violations(fake) == [
        "nekomem/domain/bad.py:1: nekomem.domain.bad imports nekomem.layers.recall.layer (layer 3 > 1)",
        "nekomem/stores/late.py:2: nekomem.stores.late imports nekomem.runtime (layer 2 > 1)",
    ]
