"""``GET /metrics``: the server's traffic, model calls, actors and storage in Prometheus
text format.

Every app has its own :class:`~prometheus_client.CollectorRegistry` (never the global
default), so several servers in one process keep apart. Three sources of series:

* HTTP requests, counted by :mod:`nekomem.http.metrics_middleware` in plain numbers on
  the event loop and turned into series at scrape time;
* counted as they happen with prometheus_client's instruments: model calls (an observer
  on :class:`~nekomem.models.llm.LLMClient`) and embedding batches (an observer on
  :class:`~nekomem.models.embeddings.EmbeddingService`), both far rarer than requests;
* read at scrape time by :class:`RuntimeCollector` from counters and state the runtime
  keeps anyway (characters, mailboxes, model jobs, outbox, storage errors): nothing is
  added to the per-message path.

No label carries user data: routes are labelled by template, model calls by the contract's
task and tier names, storage errors by error code and layer. Character names never
appear (privacy, and one series per character would not scale to a thousand of them);
per-character detail is in ``/health`` and the memory browser.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from nekomem.http.metrics_middleware import RequestCollector, RequestMetrics, RequestStats, RouteLabels
from nekomem.models.embeddings import EmbeddingService
from nekomem.models.llm import LLMClient
from nekomem.runtime.runtime import Runtime

log = logging.getLogger("nekomem.metrics")

# Seconds. Requests: a cached /cache answers in about a millisecond, a recall with a model
# rerank in seconds. Model calls: a small local model answers in tenths, a large remote
# one in tens of seconds. Embedding batches: milliseconds on CPU.
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
EMBEDDING_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
EMBEDDING_STATES = ("loading", "ready", "disabled")


class Metrics:
    """One app's registry, its event-driven instruments and the observers that feed them."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = RequestStats(REQUEST_BUCKETS)
        r.register(RequestCollector(self.requests))
        self.model_calls = Counter(
            "nekomem_model_calls",
            "LLM task calls by tier, task and outcome (ok, failed, skipped, error)",
            ["tier", "task", "outcome"],
            registry=r,
        )
        self.model_seconds = Histogram(
            "nekomem_model_call_duration_seconds",
            "Time of one LLM task call, retries and backoff included, by tier and task",
            ["tier", "task"],
            buckets=MODEL_BUCKETS,
            registry=r,
        )
        self.embedding_batches = Counter(
            "nekomem_embedding_batches", "Embedding inference batches by kind (query, passage) and outcome", ["kind", "outcome"], registry=r
        )
        self.embedding_texts = Counter("nekomem_embedding_texts", "Texts embedded by kind", ["kind"], registry=r)
        self.embedding_seconds = Histogram(
            "nekomem_embedding_batch_duration_seconds",
            "Time of one embedding batch (the wait for the model included), by kind",
            ["kind"],
            buckets=EMBEDDING_BUCKETS,
            registry=r,
        )
        r.register(RuntimeCollector(runtime))
        self._llm = runtime.llm if isinstance(runtime.llm, LLMClient) else None
        self._embeddings = runtime.embeddings if isinstance(runtime.embeddings, EmbeddingService) else None

    def attach(self) -> None:
        """Start observing the runtime's model client and embedding service."""
        if self._llm is not None:
            self._llm.add_observer(self.on_model_call)
        if self._embeddings is not None:
            self._embeddings.add_observer(self.on_embedding_batch)

    def detach(self) -> None:
        """Stop observing (an embedding service may outlive this app)."""
        if self._llm is not None:
            self._llm.remove_observer(self.on_model_call)
        if self._embeddings is not None:
            self._embeddings.remove_observer(self.on_embedding_batch)

    def on_model_call(self, task: str, tier: str, outcome: str, seconds: float) -> None:
        self.model_calls.labels(tier, task, outcome).inc()
        if outcome != "skipped":
            self.model_seconds.labels(tier, task).observe(seconds)

    def on_embedding_batch(self, kind: str, texts: int, seconds: float, ok: bool) -> None:
        self.embedding_batches.labels(kind, "ok" if ok else "error").inc()
        self.embedding_texts.labels(kind).inc(texts)
        self.embedding_seconds.labels(kind).observe(seconds)

    def exposition(self, accept: str) -> tuple[bytes, str]:
        """(body, content type) of a scrape: the Prometheus text format, or OpenMetrics
        when ``accept`` (the request's Accept header) asks for it. Collects the scrape-time
        series."""
        encode, content_type = choose_encoder(accept)
        return encode(self.registry), content_type


class RuntimeCollector(Collector):
    """Series read from the runtime at scrape time."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def collect(self) -> Iterator[Metric]:
        yield from self._characters()
        yield from self._queues()
        yield from self._models()
        yield from self._outbox_and_storage()

    def _characters(self) -> Iterator[Metric]:
        registry = self.rt.registry
        yield GaugeMetricFamily("nekomem_characters_active", "Characters whose actors are running", value=registry.active_count())
        try:
            known = len(self.rt.known_characters())
        except OSError:
            log.warning("the memory root cannot be listed for /metrics")
        else:
            yield GaugeMetricFamily("nekomem_characters_known", "Character folders under the memory root", value=known)
        yield CounterMetricFamily("nekomem_character_activations", "Characters activated since start", value=registry.activations)
        yield CounterMetricFamily(
            "nekomem_character_passivations", "Characters passivated or released since start", value=registry.passivations
        )
        yield GaugeMetricFamily(
            "nekomem_limited_mode",
            "1 while start-up recovery runs (every route but /health answers 409)",
            value=int(self.rt.blocking_reason() is not None),
        )

    def _queues(self) -> Iterator[Metric]:
        total, longest = self.rt.registry.mailbox_depths()
        yield GaugeMetricFamily(
            "nekomem_mailbox_messages", "Messages queued in the mailboxes of the active characters' actors", value=total
        )
        yield GaugeMetricFamily("nekomem_mailbox_max_messages", "Messages queued in the longest single actor mailbox", value=longest)
        dispatcher = self.rt.dispatcher
        yield GaugeMetricFamily(
            "nekomem_dispatcher_ready_mailboxes", "Mailboxes waiting for an actor worker thread", value=dispatcher.queued()
        )
        yield GaugeMetricFamily("nekomem_dispatcher_workers", "Actor worker threads", value=dispatcher.workers)
        yield GaugeMetricFamily(
            "nekomem_model_jobs", "Model jobs (LLM and embedding) queued or running in the model pool", value=self.rt.pool.total_busy()
        )

    def _models(self) -> Iterator[Metric]:
        llm = self.rt.llm
        if isinstance(llm, LLMClient):
            sent = CounterMetricFamily(
                "nekomem_model_requests",
                "HTTP requests sent to model endpoints, retries included, by tier and task",
                labels=["tier", "task"],
            )
            for (tier, task), count in sorted(llm.request_counts().items()):
                sent.add_metric([tier, task], count)
            yield sent
        yield GaugeMetricFamily(
            "nekomem_embedding_pending", "Memory entries of the active characters waiting for a vector", value=self.rt.services.pending()
        )
        emb = self.rt.embeddings
        state = GaugeMetricFamily("nekomem_embedding_state", "1 for the embedding service's current state", labels=["state"])
        current = getattr(emb, "state", "disabled") if emb is not None else "disabled"
        for name in EMBEDDING_STATES:
            state.add_metric([name], int(current == name))
        yield state

    def _outbox_and_storage(self) -> Iterator[Metric]:
        services = self.rt.services
        pending, dead = services.outbox.snapshot()
        yield GaugeMetricFamily("nekomem_outbox_pending", "Outbox records pending in the active characters", value=pending)
        yield CounterMetricFamily("nekomem_outbox_dead_letters", "Outbox records dead-lettered since start", value=dead)
        storage = services.storage
        errors = CounterMetricFamily(
            "nekomem_storage_errors",
            "Storage faults met since start, by error code and where (a layer, supervisor, http)",
            labels=["code", "where"],
        )
        faulted = 0
        if storage is not None:
            for (code, where), count in sorted(storage.error_counts().items()):
                errors.add_metric([code, where], count)
            faulted = storage.fault_count()
        yield errors
        yield GaugeMetricFamily(
            "nekomem_storage_faulted_layers", "Character layers currently refusing writes on a storage fault", value=faulted
        )


async def scrape(request: Request) -> Response:
    """``GET /metrics``. Collected on a worker thread: the scrape lists the memory root."""
    metrics: Metrics = request.app.state.metrics
    body, content_type = await asyncio.to_thread(metrics.exposition, request.headers.get("accept", ""))
    return Response(body, headers={"Content-Type": content_type})


def install(app: Starlette, runtime: Runtime) -> Metrics:
    """Give ``app`` its metrics: the registry (``app.state.metrics``) and the request
    middleware. Call after every other middleware is added, so that this one runs first
    and also counts the requests the guard refuses."""
    metrics = Metrics(runtime)
    app.state.metrics = metrics
    app.add_middleware(RequestMetrics, stats=metrics.requests, labels=RouteLabels(lambda: app.router.routes))
    return metrics
