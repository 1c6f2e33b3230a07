"""The shape every one of the user's own model endpoints shares (the embedding endpoint,
the re-ranker): where it is, which model, the key and how long one request may take.

The settings keep their documented names (``embedding_remote_*``, ``recall_rerank_*``);
each section builds its endpoint with a method of its own, and the HTTP client
(:mod:`nekomem.models.endpoint_client`) takes this one shape.
"""

from __future__ import annotations

import msgspec


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One OpenAI-compatible endpoint of the user's (immutable)."""

    base_url: str  # up to and including /v1 where the server serves it there
    model: str = ""  # sent as "model" when not empty
    api_key: str = ""  # sent as a Bearer token when not empty (never logged)
    timeout_seconds: float = 20.0  # one request's timeout
