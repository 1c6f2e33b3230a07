"""Your own embedding model behind an OpenAI-compatible ``/v1/embeddings`` endpoint (Ollama,
llama.cpp ``--embedding``, LM Studio, vLLM, TEI, Infinity, a cloud API), as a backend of
the embedding service (``embedding_model = "remote"`` in place of the bundled models, or
``use+e5+remote`` beside them; see :mod:`nekomem.models.embeddings`).

A call is ``POST {embedding_remote_base_url}/embeddings`` with
``{"model", "input": [texts], "encoding_format": "float"}`` (plus ``"dimensions"`` when
``embedding_remote_dimensions`` is set) through the shared
:class:`~nekomem.models.endpoint_client.EndpointClient`; the answer's ``data[i].embedding``
rows are put back in input order by their ``index``. Texts go in batches of
``embedding_remote_batch_size``, each request bounded by
``embedding_remote_timeout_seconds``. :meth:`RemoteEmbeddingBackend.start` runs a call on
one of ``embedding_remote_concurrency`` threads of the backend's own, so the inference
thread can stop waiting for it (a query's deadline) while the bundled models go on.

Unlike a local model, a failure is not final: :class:`RemoteEmbeddingError` fails the one
embedding (the service stays ready, recall answers from its other legs and retries its
backfill later) and the next call tries the endpoint again.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import numpy as np

from nekomem.config.embeddings import EmbeddingSettings
from nekomem.models.endpoint_client import EndpointClient, EndpointError

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_DIGEST_CHARS = 12


class RemoteEmbeddingError(EndpointError):
    """The endpoint could not embed: unreachable, timed out, an error status or an answer
    of the wrong shape. Transient: the next call tries again."""


class RemoteEmbeddingBackend:
    """Embeds through the configured endpoint (thread-safe; see the module docstring)."""

    kind = "openai-remote"
    # An endpoint embeds each input on its own: one request carries every caller's texts
    # of a micro-batch (recall.embedding_batcher). A failure fails that batch only
    # (RemoteEmbeddingError), never the service.
    batch_invariant = True

    def __init__(self, settings: EmbeddingSettings, transport: httpx.BaseTransport | None = None) -> None:
        self._s = settings
        self._client = EndpointClient(settings.remote_endpoint(), "/embeddings", error=RemoteEmbeddingError, transport=transport)
        self.url = self._client.url
        self.model = self._client.model
        self._threads = ThreadPoolExecutor(settings.embedding_remote_concurrency, thread_name_prefix="nekomem-embed-remote")

    def describe(self) -> str:
        """The endpoint and model, for logs and /health (no key, no credentials in the URL)."""
        return self._client.describe()

    def model_id(self, dim: int, prefixes: tuple[str, str]) -> str:
        """``remote-<model>-<dim>d-<digest>``: the digest covers the endpoint, the model, the
        dimensions asked for and the prefixes, so switching any of them re-embeds."""
        s = self._s
        basis = json.dumps([self.url, self.model, s.embedding_remote_dimensions, *prefixes])
        digest = hashlib.sha256(basis.encode("utf-8")).hexdigest()[:_DIGEST_CHARS]
        name = _NAME_UNSAFE.sub("_", self.model).strip("_-") or "model"
        return f"remote-{name}-{dim}d-{digest}"

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def start(self, texts: list[str]) -> Future[np.ndarray]:
        """:meth:`infer` of ``texts`` on one of the backend's threads (at most
        embedding_remote_concurrency requests run at once; later calls queue)."""
        return self._threads.submit(self.infer, texts)

    def infer(self, texts: list[str]) -> np.ndarray:
        """Float32 ``[len(texts), dim]`` rows as the endpoint gives them (not normalised).
        Raises RemoteEmbeddingError."""
        rows: list[np.ndarray] = []
        size = self._s.embedding_remote_batch_size
        for start in range(0, len(texts), size):
            rows.append(self._request(texts[start : start + size]))
        if not rows:
            raise RemoteEmbeddingError("nothing to embed")
        widths = {r.shape[1] for r in rows}
        if len(widths) != 1:
            raise RemoteEmbeddingError(f"the endpoint answered vectors of widths {sorted(widths)}")
        return np.concatenate(rows, axis=0)

    def _request(self, batch: Sequence[str]) -> np.ndarray:
        body: dict[str, object] = {"model": self.model, "input": list(batch), "encoding_format": "float"}
        if self._s.embedding_remote_dimensions:
            body["dimensions"] = self._s.embedding_remote_dimensions
        answer = self._client.post(body)
        try:
            data = answer["data"]  # type: ignore[index]
            ordered = sorted(data, key=lambda item: int(item.get("index", 0)))
            matrix = np.asarray([item["embedding"] for item in ordered], dtype=np.float32)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemoteEmbeddingError(f"answer not in the OpenAI embeddings shape ({type(exc).__name__})") from None
        if matrix.ndim != 2 or matrix.shape[0] != len(batch) or matrix.shape[1] < 1:
            raise RemoteEmbeddingError(f"answer has shape {matrix.shape} for {len(batch)} texts")
        wanted = self._s.embedding_remote_dimensions
        if wanted and matrix.shape[1] != wanted:
            raise RemoteEmbeddingError(f"answer has vectors {matrix.shape[1]} wide, {wanted} were asked for")
        return matrix
