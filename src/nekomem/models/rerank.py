"""Your own re-ranker behind a ``/rerank`` endpoint (llama.cpp ``--reranking``, vLLM, TEI,
Infinity, the Jina- and Cohere-style APIs): it re-orders the fused top
``recall_rerank_top_n`` of a user recall before the 8-row budget is applied.

A call is ``POST {recall_rerank_base_url}/rerank`` with ``{"model", "query", "documents":
[texts], "top_n"}`` (``recall_rerank_field`` = ``texts`` sends ``"texts"`` instead, as TEI
wants) and a Bearer key when one is configured. Understood answers: ``{"results": [{"index",
"relevance_score" | "score"}, ...]}`` (llama.cpp, vLLM, Jina, Cohere, Infinity) or a bare
list of ``{"index", "score" | "relevance_score"}`` (TEI). Documents the answer leaves out
keep their fused order after the ranked ones.

The request goes through the shared
:class:`~nekomem.models.endpoint_client.EndpointClient`: at most
``recall_rerank_concurrency`` requests are in flight (shared by every character), each
bounded by ``recall_rerank_timeout_seconds``; a failure raises
:class:`RerankError` and the recall answers in its fused order. :meth:`Reranker.status` is
what ``/health`` shows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from nekomem.config.recall import RecallSettings
from nekomem.models.endpoint_client import EndpointClient, EndpointError


class RerankError(EndpointError):
    """The re-ranker could not answer: unreachable, timed out, an error status or an
    answer of an unknown shape."""


def parse_ranking(answer: Any, count: int) -> list[int]:
    """The document indexes of a rerank answer, best first (each index once, inside
    ``0..count-1``). Raises RerankError on an unknown shape."""
    rows = answer.get("results", answer.get("data")) if isinstance(answer, dict) else answer
    if not isinstance(rows, list):
        raise RerankError("answer has no results list")
    scored: list[tuple[float, int, int]] = []
    for position, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("index"), int) or isinstance(row.get("index"), bool):
            raise RerankError("a result has no integer index")
        score = row.get("relevance_score", row.get("score"))
        if not isinstance(score, int | float) or isinstance(score, bool):
            raise RerankError("a result has no score")
        scored.append((-float(score), position, int(row["index"])))
    order: list[int] = []
    for _neg, _pos, index in sorted(scored):
        if 0 <= index < count and index not in order:
            order.append(index)
    return order


class Reranker:
    """The configured re-ranking endpoint (thread-safe; see the module docstring)."""

    def __init__(self, settings: RecallSettings, transport: httpx.BaseTransport | None = None) -> None:
        self.s = settings
        self._client = EndpointClient(
            settings.rerank_endpoint(), "/rerank", error=RerankError, concurrency=settings.recall_rerank_concurrency, transport=transport
        )
        self.url = self._client.url
        self._lock = threading.Lock()
        self._error: str | None = None
        self._calls = 0
        self._failures = 0
        self._last_ms: float | None = None

    def rank(self, query: str, documents: Sequence[str]) -> list[int]:
        """Every index of ``documents``, re-ordered by the endpoint (those it left out
        after, in their given order). Raises RerankError."""
        body: dict[str, object] = {"query": query, self.s.recall_rerank_field: list(documents), "top_n": len(documents)}
        if self._client.model:
            body["model"] = self._client.model
        started = time.monotonic()
        try:
            order = parse_ranking(self._client.post(body), len(documents))
        except RerankError as exc:
            self._note(started, str(exc))
            raise
        self._note(started, None)
        return order + [i for i in range(len(documents)) if i not in order]

    def _note(self, started: float, error: str | None) -> None:
        with self._lock:
            self._calls += 1
            self._last_ms = round((time.monotonic() - started) * 1000, 1)
            if error is not None:
                self._failures += 1
            self._error = error

    def status(self) -> dict[str, object]:
        """For /health: the endpoint (no credentials), state ("ok", "failing": the last
        call failed, "idle": no call yet), the last error, calls, failures, last latency."""
        with self._lock:
            state = "idle" if not self._calls else "failing" if self._error else "ok"
            out: dict[str, object] = {
                "state": state,
                "endpoint": self._client.public_url,
                "calls": self._calls,
                "failures": self._failures,
                "last_ms": self._last_ms,
            }
            if self._error:
                out["error"] = self._error
            return out

    def close(self) -> None:
        self._client.close()
