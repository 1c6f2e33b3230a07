"""The process-wide model services a server is built with, made once at start-up by the
commands that serve (``nekomem serve`` and ``nekomem neko-serve``)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from nekomem.config import Settings

if TYPE_CHECKING:  # the service's import is optional at run time (make_embeddings)
    from nekomem.models.embeddings import EmbeddingService


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (one blocked with
    ``sys.modules[module] = None`` counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def make_embeddings(settings: Settings) -> EmbeddingService | None:
    """The process-wide embedding service, or None when the optional parts are missing (the
    ``embeddings`` extra's onnxruntime: the banner then says what to install)."""
    if not installed("onnxruntime"):
        return None
    try:
        from nekomem.models.embeddings import EmbeddingService
    except ImportError:
        return None
    return EmbeddingService(settings.embeddings)
