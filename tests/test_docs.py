"""The documentation a user follows is true (issue 37, item 1): every relative link of README.md
and docs/*.md resolves (file and GitHub anchor), every table renders, every page of several
sections has a current table of contents, and every documented ``nekomem`` command, flag,
``NEKOMEM_*`` variable and setting exists. The checks live in scripts/docs_check.py; the
unit tests below feed them broken pages, so each check is shown to fail."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_check", REPO / "scripts" / "docs_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_check"] = module
    spec.loader.exec_module(module)
    return module


dc = _load()
TREE = dc.cli_tree()
SETTINGS, SECTIONS = dc.setting_names()


def _texts() -> list[tuple[Path, str]]:
    return [(path, path.read_text(encoding="utf-8")) for path in dc.pages(REPO)]


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


# --- the project's own pages ----------------------------------------------------------------------


def test_the_pages_are_the_readme_and_the_docs() -> None:
    names = {_name(p) for p, _ in _texts()}
    assert {"README.md", "docs/API.md", "docs/CONFIGURATION.md", "docs/OPERATIONS.md", "docs/NEKO.md", "docs/BENCHMARKS.md"} <= names


def test_every_relative_link_resolves() -> None:
    problems = [p for path, text in _texts() for p in dc.link_problems(path, text, REPO)]
    assert not problems, "\n".join(map(str, problems))


def test_every_table_has_a_header() -> None:
    problems = [p for path, text in _texts() for p in dc.table_problems(_name(path), text)]
    assert not problems, "\n".join(map(str, problems))


def test_every_page_has_a_current_table_of_contents() -> None:
    problems = [p for path, text in _texts() for p in dc.toc_problems(_name(path), text)]
    assert not problems, "\n".join(map(str, problems))


def test_every_documented_command_and_flag_exists() -> None:
    problems = [p for path, text in _texts() for p in dc.command_problems(_name(path), text, TREE)]
    assert not problems, "\n".join(map(str, problems))
    documented = {words[0] for _path, text in _texts() for _n, words in dc.commands_in(text) if words}
    assert {"serve", "status", "neko", "import-neko", "mcp", "backup", "cluster"} <= documented


def test_every_documented_setting_and_variable_exists() -> None:
    problems = [p for path, text in _texts() for p in dc.setting_problems(_name(path), text, SETTINGS, SECTIONS)]
    assert not problems, "\n".join(map(str, problems))


def test_the_readme_is_short_and_installs_from_the_clone() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.split()) <= 1300
    assert "[N.E.K.O.](https://github.com/Project-N-E-K-O/N.E.K.O)" in readme
    assert "**the reference chat server**" in readme
    lines = [line.split("#")[0].strip() for line in readme.splitlines()]
    assert "pip install ." in lines and "pip install '.[mcp]'" in lines
    for path, text in _texts():  # nekomem is on no registry
        assert "pip install nekomem" not in text and "install 'nekomem[" not in text, _name(path)


def test_the_configuration_page_holds_the_generated_settings() -> None:
    from nekomem.config import settings_markdown

    text = (REPO / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert dc.with_settings(text) == text
    assert settings_markdown() in text


# --- the checks fail on broken pages -------------------------------------------------------------


def test_slugs_are_githubs() -> None:
    assert dc.slug("Running it with N.E.K.O.") == "running-it-with-neko"
    assert dc.slug("Memory browser (`/ui`)") == "memory-browser-ui"
    assert dc.slug("bench.recall_latency: BM25 at 1k, 10k") == "benchrecall_latency-bm25-at-1k-10k"
    assert [a for *_x, a in dc.headings("## Notes\n\n## Notes\n\n## Notes\n")] == ["notes", "notes-1", "notes-2"]
    assert dc.anchors("```\n## not a heading\n```\n## Real\n") == {"real"}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A\n\n## Here\n", encoding="utf-8")
    page = tmp_path / "README.md"
    text = "# R\n\n## Top\n\n[ok](docs/A.md#here) [ok](#top) [web](https://example.org/x#y)\n[gone](docs/B.md) [no anchor](docs/A.md#there) [self](#nowhere)\n`[code](docs/C.md)`\n"
    problems = dc.link_problems(page, text, tmp_path)
    assert [(p.line, p.message) for p in problems] == [
        (6, "link to a missing file: docs/B.md"),
        (6, "link to a missing anchor: docs/A.md#there"),
        (6, "link to a missing anchor: #nowhere"),
    ]


def test_a_header_less_table_row_is_found() -> None:
    # The old README's lines 586-590: rows after a blank line, which render as text.
    text = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n```\n| in code |\n```\n"
    problems = dc.table_problems("x.md", text)
    assert [p.line for p in problems] == [5]


def test_a_missing_or_stale_table_of_contents_is_found() -> None:
    page = "# P\n\n## One\n\n## Two\n"
    assert dc.toc_problems("p.md", page)[0].message.startswith("no '## Contents'")
    stale = "# P\n\n## Contents\n\n<!-- toc -->\n- [One](#one)\n<!-- /toc -->\n\n## One\n\n## Two\n"
    assert "not current" in dc.toc_problems("p.md", stale)[0].message
    assert dc.toc_problems("p.md", dc.with_toc(stale)) == []
    assert dc.toc_problems("p.md", "# P\n\n## Only\n") == []
    added = dc.with_toc(page)  # a page without one gets one before its first section
    assert added.startswith("# P\n\n## Contents\n\n<!-- toc -->\n- [One](#one)\n- [Two](#two)\n<!-- /toc -->\n\n## One\n")
    assert dc.toc_problems("p.md", added) == []


def test_an_unknown_command_or_flag_is_found() -> None:
    text = (
        "```sh\nnekomem serve --port 1 --memory-root x   # fine\nnekomem serv\nnekomem serve --prot 1\n"
        ".venv/bin/nekomem cluster drain n1\nnekomem cluster drian n1\nnekomem neko -- python launcher.py --whatever\n"
        "nekomem: N.E.K.O. is running with nekomem as its memory server\n  nekomem: indented\nsee nekomem az\n```\n"
        "Run `nekomem status --json` or `nekomem statuz`; `nekomem --version`, `nekomem --verbose`.\n"
    )
    problems = dc.command_problems("x.md", text, TREE)
    assert [p.message for p in problems] == [
        "no such command: nekomem serv",
        "no such option: nekomem serve --prot",
        "no such command: nekomem cluster drian",
        "no such command: nekomem az",
        "no such command: nekomem statuz",
        "no such option: nekomem --verbose",
    ]


def test_an_unknown_setting_or_variable_is_found() -> None:
    text = (
        "Set `NEKOMEM_PORT` or `NEKOMEM_PORTT`; `NEKOMEM_LLM_<TIER>_MODEL` is a pattern; `NEKOMEM_CONFIG` names the file.\n"
        "The boot file prints `NEKOMEM_EVENT` lines and reads `NEKOMEM_NEKO_SERVE`; `NEKOMEM_EVENTS` is neither.\n"
        "The setting `import_root` and the setting `import_roots`; the `fact_extract_poll_seconds` setting.\n"
        'Write `embedding_model = "use"` or `embeding_model = "use"`; the client\'s `max_retry_wait=30` is no setting.\n'
        '```toml\nport = 1\n[llm]\nllm_model = "m"\nllm_modle = "m"\n[lmm]\n```\n'
    )
    problems = dc.setting_problems("x.md", text, SETTINGS, SECTIONS)
    assert sorted(p.message for p in problems) == sorted(
        [
            "no such setting: NEKOMEM_PORTT",
            "no such setting: NEKOMEM_EVENTS",
            "no such setting: import_roots",
            "no such setting: fact_extract_poll_seconds",
            "no such setting: embeding_model",
            "no such setting: llm_modle",
            "no such settings section: [lmm]",
        ]
    )


@pytest.mark.parametrize("page", ["README.md", "docs/OPERATIONS.md"])
def test_the_checks_run_on_the_page_as_the_script_does(page: str) -> None:
    path = REPO / page
    text = path.read_text(encoding="utf-8")
    broken = text + "\n[dangling](#no-such-section)\n\n| stray | row |\n\n`nekomem serve --no-such-flag`\n"
    assert dc.link_problems(path, broken, REPO) and dc.table_problems(page, broken) and dc.command_problems(page, broken, TREE)
