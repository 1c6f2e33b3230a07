"""``nekomem import-neko --progress`` in a real process: the log lines written during the
import never land inside the bar's line, and the bar ends on the report's count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import neko_fixture
from tests.support.live import ROOT

LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")


def test_the_bar_and_the_log_keep_to_their_own_lines(tmp_path: Path) -> None:
    fixture = neko_fixture.build(tmp_path / "neko-memory")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEKOMEM_")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["NEKOMEM_LOG_LEVEL"] = "DEBUG"  # as many log lines as the import writes
    run = subprocess.run(
        [sys.executable, "-m", "nekomem", "import-neko", str(fixture.root), "--memory-root", str(tmp_path / "root"), "--progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    read = sum(layer["read"] for c in report["characters"] for layer in c["layers"].values())
    lines = run.stderr.split("\n")
    assert any(LOG_LINE.search(line) for line in lines), "the import wrote no log line: the test shows nothing"
    for line in lines:
        shown = line.split("\r")
        assert not any("import-neko [" in piece and LOG_LINE.search(piece) for piece in shown), line
    bars = [piece for line in lines for piece in line.split("\r") if piece.startswith("import-neko [")]
    assert bars and bars[-1].endswith(f"100% {read}/{read}"), bars[-1:]
    assert f"{read} records read" in run.stderr
