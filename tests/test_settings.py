from __future__ import annotations

import subprocess
import sys

import pytest

from nekomem.config import SettingsError, load_settings, settings_markdown
from nekomem.config.settings import describe, field_index


def test_defaults_are_the_reference_numbers():
    s = load_settings(None, env={})
    assert (s.server.host, s.server.port, s.server.memory_root) == ("127.0.0.1", 48912, "./memory")
    assert s.recent.recent_compress_threshold_items == 20
    assert s.recent.recent_history_max_items == 10
    assert s.recent.recent_summary_max_tokens == 1000
    assert s.recent.recent_compress_input_budget_tokens == 8000
    assert s.recent.recent_hard_cap_tokens == 60000
    assert s.runtime.outbox_max_attempts == 5


def test_every_setting_is_documented():
    for name, (_section, _info, annotated) in field_index().items():
        assert describe(annotated), f"setting {name} has no description"
    table = settings_markdown()
    assert "NEKOMEM_PORT" in table and "NEKOMEM_LLM_SUMMARY_MODEL" in table


def test_toml_flat_and_sectioned_then_env_then_overrides(tmp_path):
    path = tmp_path / "n.toml"
    path.write_text("port = 1000\n[recent]\nrecent_hard_cap_tokens = 5000\n", encoding="utf-8")
    s = load_settings(path, env={})
    assert s.server.port == 1000 and s.recent.recent_hard_cap_tokens == 5000
    s = load_settings(path, env={"NEKOMEM_PORT": "2000", "NEKOMEM_REVIEW_ENABLED": "false"})
    assert s.server.port == 2000 and s.recent.review_enabled is False
    s = load_settings(path, env={"NEKOMEM_PORT": "2000"}, overrides={"port": 3000})
    assert s.server.port == 3000
    s = load_settings(None, env={"NEKOMEM_CONFIG": str(path)})
    assert s.server.port == 1000


def test_tier_env_names():
    s = load_settings(None, env={"NEKOMEM_LLM_BASE_URL": "http://x/v1", "NEKOMEM_LLM_SUMMARY_MODEL": "small"})
    assert s.llm.llm_base_url == "http://x/v1" and s.llm.llm_summary_model == "small"


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"NEKOMEM_PORT": "99999"}, "port"),
        ({"NEKOMEM_PORT": "abc"}, "port"),
        ({"NEKOMEM_RECENT_HARD_CAP_TOKENS": "-5"}, "recent_hard_cap_tokens"),
        ({"NEKOMEM_REVIEW_ENABLED": "maybe"}, "review_enabled"),
        ({"NEKOMEM_DISPLAY_TIMEZONE": "Asia/Tokio"}, "display_timezone"),
        ({"NEKOMEM_DISPLAY_TIMEZONE": "../etc/passwd"}, "display_timezone"),
    ],
)
def test_invalid_settings_name_the_setting(env, needle):
    with pytest.raises(SettingsError) as err:
        load_settings(None, env=env)
    assert needle in str(err.value)


def test_a_known_or_empty_display_timezone_loads():
    assert load_settings(None, env={"NEKOMEM_DISPLAY_TIMEZONE": "Asia/Tokyo"}).server.display_timezone == "Asia/Tokyo"
    assert load_settings(None, env={}).server.display_timezone == ""


def test_unknown_setting_in_toml(tmp_path):
    path = tmp_path / "n.toml"
    path.write_text("no_such_thing = 1\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="no_such_thing"):
        load_settings(path, env={})


def test_cli_refuses_to_start_on_an_invalid_setting(tmp_path):
    env = {"NEKOMEM_PORT": "-3", "PATH": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "nekomem", "serve", "--memory-root", str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "port" in proc.stderr


def test_docs_settings_table_is_current():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "CONFIGURATION.md").read_text(encoding="utf-8")
    assert settings_markdown() in doc, "docs/CONFIGURATION.md is stale: regenerate it with `python scripts/docs_check.py --write`"


def test_an_unknown_nekomem_variable_is_refused_naming_the_closest_setting(tmp_path):
    import os
    import subprocess
    import sys

    from tests.support.live import ROOT

    with pytest.raises(SettingsError, match=r"NEKOMEM_PROT \(did you mean NEKOMEM_PORT\?\)"):
        load_settings(None, env={"NEKOMEM_PROT": "1"})
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_check_examples", ROOT / "scripts" / "docs_check.py")
    assert spec is not None and spec.loader is not None
    docs_check = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = docs_check  # its dataclasses look their module up there
    spec.loader.exec_module(docs_check)
    for example in docs_check.REFUSED_EXAMPLES:  # the docs quote them as refused: they must stay so
        with pytest.raises(SettingsError, match=example):
            load_settings(None, env={example: "1"})
    with pytest.raises(SettingsError, match="NEKOMEM_FACT_EXTRACT_POLL_SECONDS"):  # a removed setting
        load_settings(None, env={"NEKOMEM_FACT_EXTRACT_POLL_SECONDS": "10"})
    # What nekomem reads besides the settings passes; other programs' variables too.
    load_settings(None, env={"NEKOMEM_URL": "http://127.0.0.1:1", "NEKOMEM_PORT": "1", "NEKO_INSTANCE_ID": "x", "NEKOMEM_NODE1": "h:1"})
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["NEKOMEM_PROT"] = "48000"
    done = subprocess.run(
        [sys.executable, "-m", "nekomem", "serve", "--memory-root", str(tmp_path / "m")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "NEKOMEM_PROT (did you mean NEKOMEM_PORT?)" in done.stderr, done.stderr
    assert "listening on" not in done.stderr and not (tmp_path / "m").exists()


def test_the_neko_boot_variable_is_known_to_the_settings():
    # neko_boot runs in N.E.K.O.'s own Python (stdlib only), so it names the variable itself.
    from nekomem.cli import neko_boot
    from nekomem.config.settings import OTHER_VARIABLES

    assert neko_boot.SERVE_ENV in OTHER_VARIABLES
    load_settings(None, env={neko_boot.SERVE_ENV: "[]"})
