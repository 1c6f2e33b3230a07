"""The start-up banner of ``nekomem serve``: where the server listens, the memory browser's
address, the memory root, each model tier and the embedding model, and any warning about
the model settings (an empty model name, a base URL without a scheme)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import nekomem
from nekomem.config import Settings
from nekomem.config.server import url_of
from nekomem.models.llm import resolve_endpoints
from nekomem.models.tier_health import endpoint_warnings, public_url
from nekomem.stores.layout import list_characters

# What is skipped without any model tier (shown in the banner and the memory browser).
NO_MODEL_NOTE = "no model configured: turns are stored, windowed and recalled, but no facts or reflections are made"


def model_lines(settings: Settings, no_model_hint: str = "set NEKOMEM_LLM_BASE_URL and NEKOMEM_LLM_MODEL") -> tuple[list[str], list[str]]:
    """(one line per model tier, warnings about the model settings); ``no_model_hint`` says
    how to configure one when no tier has a model."""
    endpoints = resolve_endpoints(settings.llm)
    lines = []
    for tier, endpoint in endpoints.items():
        if endpoint is None:
            lines.append(f"{tier}: not configured")
        else:
            lines.append(f"{tier}: {endpoint.model or '(no model name)'} at {public_url(endpoint.base_url)}")
    warnings = endpoint_warnings({t: (e.base_url, e.model) if e else None for t, e in endpoints.items()})
    if all(e is None for e in endpoints.values()):
        warnings.append(f"{NO_MODEL_NOTE} ({no_model_hint})")
    return lines, warnings


def embedding_line(settings: Settings, state: str | None) -> str:
    """The embedding model and its state (``state`` None: no embedding runtime installed)."""
    emb = settings.embeddings
    if not emb.embedding_enabled:
        return "off (embedding_enabled = false): recall uses BM25 only"
    if state is None:
        return "not installed (pip install '.[embeddings]' in the nekomem folder): recall uses BM25 only"
    model = emb.embedding_model_dir or emb.embedding_model
    return f"{model}, {state}" + (" in the background (recall uses BM25 until it is ready)" if state == "loading" else "")


def print_banner(
    settings: Settings,
    embedding_state: str | None,
    out: TextIO,
    notes: Sequence[tuple[str, str]] = (),
    no_model_hint: str | None = None,
) -> list[str]:
    """Write the banner to ``out`` and return its warnings (the caller logs them too).
    ``notes`` are extra (label, value) rows after the model tiers (``nekomem neko``: what
    it took from N.E.K.O.); ``no_model_hint`` replaces the hint of the no-model warning."""
    server = settings.server
    url = url_of(server.host, server.port)
    root = Path(server.memory_root).resolve()
    try:
        known = len(list_characters(root)) if root.is_dir() else 0
    except OSError:
        known = 0
    tiers, warnings = model_lines(settings) if no_model_hint is None else model_lines(settings, no_model_hint)
    rows = [
        ("listening on", f"{url}" + ("  (bearer token required)" if server.api_token else "")),
        ("memory browser", f"{url}/ui"),
        ("memory root", f"{root} ({known} character{'s' if known != 1 else ''})"),
        ("model tiers", tiers[0]),
        *(("", line) for line in tiers[1:]),
        *notes,
        ("embeddings", embedding_line(settings, embedding_state)),
        ("health", f"{url}/health  (or: nekomem status)"),
    ]
    width = max(len(label) for label, _ in rows)
    out.write(f"nekomem {nekomem.__version__}\n")
    for label, value in rows:
        out.write(f"  {label.ljust(width)}  {value}\n")
    for warning in warnings:
        out.write(f"  warning: {warning}\n")
    out.flush()
    return warnings
