"""Beyond the reference: the user's chat model as the re-ranker of explicit recalls
(``recall_llm_rerank``), for a user who has a chat model configured and no ``/rerank``
endpoint (:mod:`nekomem.models.rerank`).

One call of the ``rerank`` task (the summary tier, :func:`nekomem.domain.prompts.longterm.
rerank_messages`: the query and the fused candidates as ``[id] text`` lines, each cut to
``evidence_per_observation_max_tokens``) re-orders the fused top ``recall_rerank_top_n``;
no retry, and the request is cut at ``recall_rerank_timeout_seconds`` (the recall stops
waiting then too and answers in the fused order).

The model's answer is untrusted: only the first ``_IDS_READ`` ids of it are read, an id that
names no candidate or repeats one is skipped, and every candidate it leaves out follows in
its fused order, so no row is ever lost and nothing loops on the answer. Any failure
(timeout, an error status, an answer that is not the task's JSON) raises
:class:`~nekomem.models.rerank.RerankError`, and the recall answers in the fused order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from nekomem.config.longterm import LongTermSettings
from nekomem.config.recall import RecallSettings
from nekomem.domain.prompts.longterm import RERANK_TASK, rerank_messages
from nekomem.domain.tokens import TokenCounter
from nekomem.models.llm import LLMClient, LLMError
from nekomem.models.tasks import RerankOutput, UnknownTaskError
from nekomem.models.rerank import RerankError

# The task's tier (providers.tasks): the re-rank runs only while it has an endpoint.
RERANK_TIER = "summary"
# At most this many ids of an answer are read, per candidate (a model that repeats itself
# costs nothing more than this).
_IDS_READ = 4


def order_from_ids(ids: Sequence[object], candidates: Sequence[str]) -> list[int]:
    """The candidate indexes ``ids`` name, first mention first, then every candidate left
    out in its given order: always a permutation of ``range(len(candidates))``."""
    where = {cid: i for i, cid in enumerate(candidates)}
    order: list[int] = []
    taken: set[int] = set()
    for cid in ids[: _IDS_READ * len(candidates)]:
        index = where.get(cid) if isinstance(cid, str) else None
        if index is not None and index not in taken:
            taken.add(index)
            order.append(index)
    return order + [i for i in range(len(candidates)) if i not in taken]


class LlmReranker:
    """The chat model as a re-ranker (thread-safe; see the module docstring)."""

    kind = "llm"

    def __init__(self, llm: LLMClient, recall: RecallSettings, longterm: LongTermSettings, counter: TokenCounter) -> None:
        self._llm = llm
        self._recall = recall
        self._longterm = longterm
        self._counter = counter
        self._lock = threading.Lock()
        self._calls = 0
        self._failures = 0
        self._tokens_sent = 0
        self._last_ms: float | None = None
        self._error: str | None = None

    def ready(self) -> bool:
        """Whether the chat model's tier has an endpoint now."""
        try:
            return self._llm.available(RERANK_TIER)
        except ValueError:
            return False

    def rank(self, query: str, documents: Sequence[str], ids: Sequence[str] = ()) -> list[int]:
        """Every index of ``documents``, re-ordered by the model (see :func:`order_from_ids`);
        ``ids`` name the documents in the prompt (default ``m1``, ``m2``, ...). Raises
        RerankError when the call fails."""
        names = list(ids) if len(ids) == len(documents) else [f"m{i + 1}" for i in range(len(documents))]
        messages = rerank_messages(
            [query],
            list(zip(names, documents, strict=True)),
            limit=len(documents),
            count_tokens=self._counter.count,
            settings=self._longterm,
        )
        sent = sum(self._counter.count(str(m.get("content", ""))) for m in messages)
        started = time.monotonic()
        try:
            out = self._llm.run(RERANK_TASK, messages, timeout=self._recall.recall_rerank_timeout_seconds, max_retries=0)
            if not isinstance(out, RerankOutput):
                raise RerankError(f"answer of type {type(out).__name__}")
        except (LLMError, UnknownTaskError, RerankError) as exc:
            self._note(started, sent, f"{type(exc).__name__}: {exc}"[:300])
            raise RerankError(str(exc)[:300]) from None
        self._note(started, sent, None)
        return order_from_ids(out.ids, names)

    def _note(self, started: float, sent: int, error: str | None) -> None:
        with self._lock:
            self._calls += 1
            self._tokens_sent += sent
            self._last_ms = round((time.monotonic() - started) * 1000, 1)
            if error is not None:
                self._failures += 1
            self._error = error

    def status(self) -> dict[str, object]:
        """For /health: kind "llm", state ("idle", "ok", "failing"), calls, failures, the
        prompt tokens sent in all, the last latency and the last error."""
        with self._lock:
            out: dict[str, object] = {
                "kind": self.kind,
                "state": "idle" if not self._calls else "failing" if self._error else "ok",
                "calls": self._calls,
                "failures": self._failures,
                "tokens_sent": self._tokens_sent,
                "last_ms": self._last_ms,
            }
            if self._error:
                out["error"] = self._error
            return out

    def close(self) -> None:
        """Nothing to release: the chat model's client belongs to the runtime."""
