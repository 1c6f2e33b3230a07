"""``nekomem status``: ask the running server's ``/health`` and print a short summary
(``--json`` prints the whole answer). Exit code 0 when the server answers and is ``ok``,
1 when it cannot be reached or refuses, 3 when it answers ``degraded`` or ``starting``."""

from __future__ import annotations

import argparse
import json
import os
from typing import TextIO

import msgspec

from nekomem.client import NekomemClient, NekomemError
from nekomem.http.schemas import HealthAnswer


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``status`` on the command line's sub-commands."""
    status = sub.add_parser("status", help="ask the running server's /health and print a summary")
    status.add_argument("--url", help="the running server (default $NEKOMEM_URL, else the serve settings' host and port)")
    status.add_argument("--config", help="TOML settings file (env NEKOMEM_CONFIG), for the default URL")
    status.add_argument("--json", action="store_true", help="print the whole /health answer as JSON")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")


def summary(health: HealthAnswer) -> list[str]:
    """The lines ``nekomem status`` prints for one /health answer."""
    lines = [f"nekomem {health.version}: {health.overall}" + (f" ({health.blocking_reason})" if health.blocking_reason else "")]
    lines.append(f"  active characters  {health.active_characters}")
    if health.llm is not None:
        for name, tier in health.llm.tiers.items():
            if not tier.configured:
                lines.append(f"  {name:<17}  not configured")
                continue
            text = f"{tier.state}, {tier.model or '(no model name)'} at {tier.base_url}"
            if tier.state == "failing":
                text += f", failing since {tier.failing_since}: {tier.last_error}"
            elif tier.last_success_at:
                text += f", last answer {tier.last_success_at}"
            lines.append(f"  {name:<17}  {text}")
        lines.extend(f"  warning: {w}" for w in health.llm.config_warnings)
    if health.embeddings is not None:
        emb = health.embeddings
        lines.append(f"  {'embeddings':<17}  {emb.state} {emb.model}".rstrip() + (f", {emb.pending} pending" if emb.pending else ""))
    return lines


def run(url: str, *, as_json: bool, timeout: float, out: TextIO, err: TextIO) -> int:
    """Ask ``url``'s /health and print it; the exit code (see the module)."""
    try:
        with NekomemClient(url, token=os.environ.get("NEKOMEM_API_TOKEN"), timeout=timeout, retries=0) as client:
            health = client.health()
    except NekomemError as exc:
        where = "is not reachable" if exc.status == 0 else f"answered {exc.status} {exc.error_code}"
        err.write(f"nekomem status: the server at {url} {where}: {exc.message}\n")
        return 1
    if as_json:
        out.write(json.dumps(msgspec.to_builtins(health), ensure_ascii=False, indent=2) + "\n")
    else:
        out.write("\n".join(summary(health)) + "\n")
    return 0 if health.overall == "ok" else 3
