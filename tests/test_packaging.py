"""nekomem installs as a package from its folder (issue 37, item 2): ``python -m build`` makes a
wheel that passes ``twine check`` and carries the memory browser's files and ``py.typed``; the
installed wheel runs; a missing optional extra is one line that says what to install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist built from a copy of the project (the work tree stays clean)."""
    pytest.importorskip("build")
    work = tmp_path_factory.mktemp("build")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, work / name)
    shutil.copytree(SRC, work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    # No isolation: the test environment's setuptools (the test extra pins one new enough)
    # builds it, so the test needs no download.
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), str(work)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / "dist"


def _wheel(dist: Path) -> Path:
    (wheel,) = dist.glob("nekomem-*.whl")
    return wheel


def test_the_wheel_and_sdist_pass_twine_check(dist: Path) -> None:
    pytest.importorskip("twine")
    files = sorted(str(p) for p in dist.iterdir())
    assert len(files) == 2, files
    proc = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *files], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_the_wheel_carries_every_source_file_the_browser_and_py_typed(dist: Path) -> None:
    names = set(zipfile.ZipFile(_wheel(dist)).namelist())
    package = SRC / "nekomem"
    expected = {
        str(path.relative_to(SRC)).replace(os.sep, "/")
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    assert "nekomem/py.typed" in expected and "nekomem/ui/static/index.html" in expected
    assert expected - names == set()
    entry_points = zipfile.ZipFile(_wheel(dist)).read("nekomem-0.1.0.dist-info/entry_points.txt").decode()
    assert "nekomem = nekomem.cli.main:main" in entry_points


def test_the_installed_wheel_runs_and_finds_its_browser(dist: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(_wheel(dist))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    probe = (
        "import nekomem, nekomem.ui, pathlib, sys;"
        "static = pathlib.Path(nekomem.ui.__file__).parent / 'static';"
        "print(nekomem.__file__); print((static / 'index.html').is_file(), (static / 'app.js').is_file())"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    where, found = proc.stdout.splitlines()
    assert Path(where).is_relative_to(target), where  # the wheel's copy, not the work tree's
    assert found == "True True"
    version = subprocess.run(
        [sys.executable, "-m", "nekomem", "--version"], capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path
    )
    assert version.returncode == 0 and version.stdout.strip() == "nekomem 0.1.0", version.stdout + version.stderr


def _run_blocked(blocked: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where ``blocked`` cannot be imported."""
    program = f"import sys; sys.modules[{blocked!r}] = None\n{code}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO)])}
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60)


def test_nekomem_mcp_without_the_extra_says_what_to_install() -> None:
    proc = _run_blocked(
        "mcp", "from nekomem.cli.main import main\nsys.exit(main(['mcp', '--character', 'Lan', '--url', 'http://127.0.0.1:9']))"
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "nekomem mcp needs the optional 'mcp' extra, which is not installed: run pip install '.[mcp]' in the nekomem folder"
    ]


def test_serving_without_the_embeddings_extra_says_what_to_install() -> None:
    code = (
        "import io\n"
        "from nekomem.server.model_services import make_embeddings\n"
        "from nekomem.cli.banner import print_banner\n"
        "from nekomem.config import load_settings\n"
        "settings = load_settings(None, env={})\n"
        "service = make_embeddings(settings)\n"
        "print(service)\n"
        "print_banner(settings, None, sys.stdout)\n"
    )
    proc = _run_blocked("onnxruntime", code)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "None"
    (embeddings,) = [line for line in lines if line.strip().startswith("embeddings")]
    assert "not installed (pip install '.[embeddings]' in the nekomem folder)" in embeddings
