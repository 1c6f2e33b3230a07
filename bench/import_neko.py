"""Cost of ``import-neko`` on a large reference folder, against copying the same folder.

Builds a synthetic reference (N.E.K.O.) memory folder (``--rows`` journal rows in sessions
of 4, ``--facts`` facts, a tenth of that in reflections, some persona entries) with the
writers of tests/support/neko_fixture.py, then times, side by side in one run:

1. baseline: ``shutil.copytree`` of the source folder (reading and writing the same bytes);
2. the first import into an empty memory root (validation, time conversion, journal
   merge, atomic view writes);
3. the same import again (everything ``unchanged``: the idempotency check alone).

    python -m bench.import_neko [--rows 50000] [--facts 5000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench._common import smoke_option
from nekomem.config import load_settings
from nekomem.importer.neko import plan, run_import
from tests.support import neko_fixture as nf


def build(folder: Path, rows: int, facts: int) -> None:
    now = datetime.now().replace(microsecond=0)
    folder.mkdir(parents=True)
    journal: list[tuple[int, str, Any, str | None]] = []
    for i in range(rows):
        at = now - timedelta(minutes=rows - i)
        role = "human" if i % 2 == 0 else "ai"
        journal.append((i + 1, f"session-{i // 4}", {"type": role, "data": {"content": f"line {i} about coffee and cats"}}, str(at)))
    nf._journal_db(folder / "time_indexed.db", journal)
    fact_records = [
        nf.fact(f"fact_{i:014d}_{i:08x}", f"master fact number {i} likes item {i % 97}", now - timedelta(hours=i)) for i in range(facts)
    ]
    nf._write(folder / "facts.json", fact_records)
    refs = [
        nf.reflection(f"ref_{i:016x}", f"reflection {i}", "pending", now - timedelta(hours=i), [fact_records[i]["id"]])
        for i in range(facts // 10)
    ]
    nf._write(folder / "reflections.json", refs)
    nf._write(
        folder / "persona.json", {"master": {"facts": [nf.persona_entry(f"manual_{i:08d}", f"persona {i}", "manual") for i in range(200)]}}
    )
    nf._write(folder / "recent.json", [j[2] for j in journal[-20:]])


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--facts", type=int, default=5_000)
    smoke_option(parser, None, rows=500, facts=50)
    args = parser.parse_args()
    print(f"cores={os.cpu_count()} load1={os.getloadavg()[0]:.2f} rows={args.rows} facts={args.facts}")
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "neko" / "bench-cat"
        build(source, args.rows, args.facts)
        size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
        copy_s, _ = timed(lambda: shutil.copytree(source, Path(tmp) / "copy"))
        settings = load_settings(None, env={}, overrides={"memory_root": str(Path(tmp) / "root")})

        def once() -> Any:
            report, sources = plan(source.parent, Path(tmp) / "root", settings)
            return run_import(report, sources, settings)

        first_s, first = timed(once)
        again_s, again = timed(once)
        records = args.rows + args.facts + args.facts // 10 + 200 + 20
        print(f"source {size / 1e6:.1f} MB, {records} records")
        print(f"copytree      {copy_s:8.3f} s")
        print(
            f"import        {first_s:8.3f} s  added={first.added}  ratio vs copy {first_s / copy_s:7.1f}x  {records / first_s:9.0f} records/s"
        )
        print(f"import again  {again_s:8.3f} s  added={again.added}  ratio vs copy {again_s / copy_s:7.1f}x")


if __name__ == "__main__":
    main()
