"""The local sentence-embedding service (onnxruntime on CPU), shared by every character.

One ``EmbeddingService`` per process. ``start()`` loads the model in a background thread;
until it is ready ``embed`` raises ``EmbeddingsUnavailable`` and callers take their
no-vector fallback. Any load or inference failure disables the service for the rest of the
process (the state is sticky), with a reason string ``"<code>: <detail>"``.

Two kinds of model directory are understood:

* ``use-string-input``: a graph that takes a string tensor and tokenises inside (the default
  Universal Sentence Encoder multilingual model, whose SentencePiece op comes from
  ``onnxruntime-extensions``). Installed by ``scripts/fetch_model.py``.
* ``hf-tokenizer``: ``model.onnx`` plus ``tokenizer.json`` for the HuggingFace ``tokenizers``
  library; inputs are discovered from the session, token outputs are pooled (mean, cls or
  last token) and prefixes for queries and passages are configurable.

A folder's ``profile.json`` (written by ``scripts/fetch_model.py``), when it names them,
decides the kind, pooling, token limit and query/passage prefixes of its model; the
``embedding_*`` settings of the same name apply to models whose profile does not.

With two models (``embedding_model = "use+e5"``) every text gets both embeddings, each
L2-normalised and scaled by ``1/sqrt(2)``, concatenated: one unit vector whose dot product
is the mean of the two models' cosines (what dedup and refinement use), and whose halves
:attr:`EmbeddingService.legs` names so recall can search each model on its own.

With ``embedding_model = "remote"`` the model is the user's own OpenAI-compatible
``/v1/embeddings`` endpoint (:mod:`nekomem.models.embedding_remote`): its width is learnt
from a first request (tried again every ``embedding_remote_retry_seconds`` while the
endpoint cannot be reached; the service stays "loading" meanwhile), and a failed request
fails that one embedding only: the service stays ready and shows the failure as ``error``
until a request succeeds again. ``use+remote``, ``e5+remote`` and ``use+e5+remote`` put the
endpoint's vectors beside the bundled models' as one more block of columns (one more
recall leg, each block scaled by ``1/sqrt(n)``). Its request runs on a thread of its own
while the bundled models infer; when it fails, or is still running at 80% of the earliest
deadline of a batch's queries, those queries get zeros in the endpoint's columns (its leg
finds nothing, the other legs answer) and the batch's passages fail (their backfill is
retried, so no stored vector ever lacks the endpoint's part). With
``embedding_remote_dimensions`` set, an endpoint that is down at start does not hold the
bundled models back: the width is taken from the setting.

Vectors come back as float32 ``[N, dim]`` rows with unit L2 norm. The model id names the
model, its dimension and a sha256 prefix of the files (and of the settings that change the
vectors), so caches on entries notice when the model changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from nekomem.config.embeddings import EmbeddingSettings, find_project_root, model_dirs, read_profile, resolve_model_dir, uses_remote
from nekomem.models.embedding_backends import Backend, Disable, StringInputBackend, TokenizerBackend
from nekomem.models.embedding_batcher import BatcherClosed, MicroBatcher, Pending, RequestExpired
from nekomem.models.embedding_remote import RemoteEmbeddingBackend, RemoteEmbeddingError

__all__ = [
    "EmbeddingService",
    "EmbeddingsUnavailable",
    "RequestExpired",
    "VectorLeg",
    "find_project_root",
    "parse_model_dim",
    "resolve_model_dir",
    "text_sha256",
]

log = logging.getLogger(__name__)

EmbedKind = Literal["query", "passage"]
State = Literal["loading", "ready", "disabled"]
QueryDone = Callable[[npt.NDArray[np.float32] | None, BaseException | None], None]
"""Told the outcome of :meth:`EmbeddingService.embed_for_user`: ``(vectors, None)`` or ``(None, error)``."""
BatchObserver = Callable[[str, int, float, bool], None]
"""Told of every inference batch of :meth:`EmbeddingService.embed` as ``(kind, texts,
seconds, ok)``; called on the embedding thread, it must be quick and must not raise."""

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx_data"
TOKENIZER_FILE = "tokenizer.json"
PROFILE_FILE = "profile.json"
_HASH_CHUNK = 1 << 20
_DIGEST_CHARS = 12
_PROBE_TEXT = "probe"
_MODEL_ID_DIM = re.compile(r"-(\d+)d(?=-|$)")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# Beside bundled models, a batch of queries waits for the endpoint until this share of the
# time left to its earliest deadline: the rest is for the answer to reach the recall.
_REMOTE_WAIT_SHARE = 0.8


class _TryAgain(Exception):
    """Internal: a remote endpoint could not be reached while loading; try again later."""


class EmbeddingsUnavailable(RuntimeError):
    """Embeddings cannot be computed now: the model is still loading or is disabled."""

    def __init__(self, state: str, reason: str | None) -> None:
        super().__init__(f"embeddings unavailable ({state}{': ' + reason if reason else ''})")
        self.state = state
        self.reason = reason


def text_sha256(text: str) -> str:
    """sha256 hex digest of the UTF-8 text (the cache key of a vector on an entry)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_model_dim(model_id: str) -> int | None:
    """Dimension encoded in a model id (``...-512d-...``), or None if there is none."""
    found = _MODEL_ID_DIM.findall(model_id or "")
    return int(found[-1]) if found else None


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(_HASH_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class VectorLeg:
    """One model's columns inside the service's vectors: ``[start, stop)``, the weight its
    unit vector was scaled by, and the recall cosine threshold from its profile (None: the
    recall_cosine_threshold setting)."""

    name: str
    start: int
    stop: int
    weight: float
    recall_threshold: float | None


@dataclass(frozen=True)
class _Slot:
    backend: Backend
    model_id: str
    dim: int
    query_prefix: str
    passage_prefix: str
    leg: VectorLeg


class EmbeddingService:
    """Process-wide embedding model; thread-safe.

    Lifecycle: state "loading" from construction until the background load finishes (or
    until start has been called and the delay has passed), then "ready" or "disabled".
    "disabled" is final. Every inference runs on the inference thread(s) (``nekomem-embed-N``, a
    :class:`~nekomem.models.embedding_batcher.MicroBatcher`): the texts of callers that
    arrive while a batch runs are embedded together in the next one, queries before
    passages; each model call uses the session's intra-op threads, and two calls at once
    would only oversubscribe the CPU.
    """

    def __init__(self, settings: EmbeddingSettings, project_root: Path | None = None) -> None:
        self._settings = settings
        self._project_root = project_root
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._state: State = "loading"
        self._reason: str | None = None
        self._slots: tuple[_Slot, ...] = ()
        self._model_id: str | None = None
        self._dim: int | None = None
        self._observers: tuple[BatchObserver, ...] = ()
        self._error: str | None = None  # the last failure of a remote endpoint (cleared by a success)
        self._stopped = threading.Event()
        self._batcher: MicroBatcher[_Item, npt.NDArray[np.float32]] = MicroBatcher(
            self._run_batch,
            settings.embedding_max_batch_size,
            "nekomem-embed",
            self._after_batch,
            workers=inference_workers(settings.embedding_inference_threads, settings.embedding_intra_op_threads),
            # Background work (duplicate checks, the vector backfill) leaves one thread free
            # for a user's query when there are two or more.
            reserve=_BACKGROUND_QUERIES,
        )
        self._trim = _heap_trimmer() if settings.embedding_trim_memory_seconds > 0 else None
        self._trimmed_at = 0.0
        if not settings.embedding_enabled:
            self._state = "disabled"
            self._reason = "disabled by configuration"
            self._settled.set()

    # -- status -----------------------------------------------------------------------

    @property
    def state(self) -> State:
        """ "loading" (not ready yet), "ready" or "disabled"."""
        return self._state

    @property
    def reason(self) -> str | None:
        """Why the service is disabled ("<code>: <detail>"), else None."""
        return self._reason

    @property
    def model_id(self) -> str | None:
        """Id of the loaded model (name, dim, sha256 prefix); None unless ready."""
        return self._model_id if self._state == "ready" else None

    @property
    def dim(self) -> int | None:
        """Vector dimension of the loaded model; None unless ready."""
        return self._dim if self._state == "ready" else None

    @property
    def is_ready(self) -> bool:
        return self._state == "ready"

    @property
    def legs(self) -> tuple[VectorLeg, ...]:
        """The models inside the vectors, in column order (one for a single model); () unless ready."""
        return tuple(slot.leg for slot in self._slots) if self._state == "ready" else ()

    @property
    def error(self) -> str | None:
        """The last failure of a remote endpoint while it lasts (the next success clears
        it); None for a local model, which is disabled by a failure instead."""
        return self._error

    def status(self) -> dict[str, Any]:
        """Metadata for health output: state, model_id, dim, reason, error."""
        with self._lock:
            ready = self._state == "ready"
            return {
                "state": self._state,
                "model_id": self._model_id if ready else None,
                "dim": self._dim if ready else None,
                "reason": self._reason,
                "error": self._error,
            }

    def add_observer(self, observer: BatchObserver) -> None:
        """Tell ``observer`` of every inference batch from now on (see BatchObserver)."""
        with self._lock:
            self._observers = (*self._observers, observer)

    def remove_observer(self, observer: BatchObserver) -> None:
        """Stop telling ``observer``; no error when it was not added."""
        with self._lock:
            self._observers = tuple(o for o in self._observers if o is not observer)

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Begin loading in a background thread after embedding_load_delay_seconds.

        Returns at once; calling it again, or on a disabled service, does nothing.
        """
        with self._lock:
            if self._state != "loading" or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._load_after_delay, name="nekomem-embeddings-load", daemon=True)
            self._thread.start()

    def load_now(self) -> None:
        """Start loading without waiting for the rest of the delay (e.g. on first traffic)."""
        self._wake.set()
        self.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until loading has finished (or timeout seconds); True when ready.

        Does not start loading by itself.
        """
        self._settled.wait(timeout)
        return self._state == "ready"

    def close(self) -> None:
        """Disable the service and release the model (reason "closed" unless already disabled)."""
        with self._lock:
            if self._state != "disabled":
                self._state = "disabled"
                self._reason = "closed"
            slots, self._slots = self._slots, ()
        self._stopped.set()
        self._batcher.close()
        self._wake.set()
        self._settled.set()
        for slot in slots:
            closer = getattr(slot.backend, "close", None)
            if closer is not None:
                closer()

    def _load_after_delay(self) -> None:
        self._wake.wait(self._settings.embedding_load_delay_seconds)
        if self._state != "loading":
            return
        started = time.monotonic()
        try:
            while True:
                try:
                    slots = self._load()
                    break
                except _TryAgain as exc:
                    self._error = str(exc)
                    log.warning(
                        "embedding endpoint not reachable (%s); trying again in %.0f s", exc, self._settings.embedding_remote_retry_seconds
                    )
                    if self._stopped.wait(self._settings.embedding_remote_retry_seconds):
                        return
        except Disable as exc:
            self._disable(exc.reason)
            return
        except Exception as exc:  # noqa: BLE001 - any load failure disables, never crashes
            self._disable(f"load_raised: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            if self._state != "loading":
                return  # closed while loading
            self._slots = slots
            self._model_id, self._dim = self._combined_id(slots), sum(slot.dim for slot in slots)
            self._state = "ready"
        self._settled.set()
        kinds = "+".join(slot.backend.kind for slot in slots)
        log.info(
            "embedding model ready: id=%s dim=%d kind=%s load_seconds=%.2f", self._model_id, self._dim, kinds, time.monotonic() - started
        )

    def _disable(self, reason: str) -> None:
        with self._lock:
            if self._state == "disabled":
                return
            self._state = "disabled"
            self._reason = reason
            self._slots = ()
        self._settled.set()
        log.warning("embeddings disabled for this process: %s", reason)

    # -- loading ----------------------------------------------------------------------

    def _load(self) -> tuple[_Slot, ...]:
        """Load every configured model; raises Disable (or anything a loader raises)."""
        s = self._settings
        folders = model_dirs(s.embedding_model, s.embedding_model_dir, self._project_root)
        remote = uses_remote(s.embedding_model) and not s.embedding_model_dir
        count = len(folders) + (1 if remote else 0)
        weight = 1.0 / float(np.sqrt(count))
        slots: list[_Slot] = []
        start = 0
        for folder in folders:
            profile = read_profile(folder)
            backend, model_id, dim, prefixes = self._load_one(folder, profile)
            threshold = (profile.get("settings") or {}).get("recall_cosine_threshold") if count > 1 else None
            leg = VectorLeg(folder.name, start, start + dim, weight, float(threshold) if isinstance(threshold, int | float) else None)
            slots.append(_Slot(backend, model_id, dim, prefixes[0], prefixes[1], leg))
            start += dim
        if remote:
            try:
                slots.append(self._load_remote(start, weight, beside=bool(folders)))
            except BaseException:
                for slot in slots:
                    closer = getattr(slot.backend, "close", None)
                    if closer is not None:
                        closer()
                raise
        return tuple(slots)

    def _load_remote(self, start: int, weight: float, beside: bool) -> _Slot:
        """The remote endpoint's slot at column ``start``, its width learnt from one request
        (or, ``beside`` bundled models, taken from embedding_remote_dimensions when the
        endpoint cannot answer now); raises _TryAgain while it cannot be learnt."""
        s = self._settings
        backend = RemoteEmbeddingBackend(s)
        try:
            probe = backend.infer([s.embedding_passage_prefix + _PROBE_TEXT])
            dim = int(probe.shape[1])
            if not np.isfinite(probe).all():
                backend.close()
                raise Disable("unsupported_model", "the endpoint's probe vector is not finite")
            self._error = None
        except RemoteEmbeddingError as exc:
            if not (beside and s.embedding_remote_dimensions):
                backend.close()
                raise _TryAgain(f"{backend.describe()}: {exc}") from None
            dim = s.embedding_remote_dimensions
            self._error = f"remote_failed: {exc}"
            log.warning("embedding endpoint not reachable (%s); its leg waits, the bundled legs answer", exc)
        prefixes = (s.embedding_query_prefix, s.embedding_passage_prefix)
        leg = VectorLeg("remote", start, start + dim, weight, None)
        return _Slot(backend, backend.model_id(dim, prefixes), dim, prefixes[0], prefixes[1], leg)

    @staticmethod
    def _combined_id(slots: Sequence[_Slot]) -> str:
        if len(slots) == 1:
            return slots[0].model_id
        names = "+".join(_MODEL_ID_DIM.split(slot.model_id)[0] for slot in slots)
        digest = hashlib.sha256("\n".join(slot.model_id for slot in slots).encode("utf-8")).hexdigest()
        return f"{names}-{sum(slot.dim for slot in slots)}d-{digest[:_DIGEST_CHARS]}"

    def _load_one(self, folder: Path, profile: dict[str, Any]) -> tuple[Backend, str, int, tuple[str, str]]:
        """Load the model in folder: (backend, model id, dim, (query prefix, passage prefix))."""
        s = self._settings
        # Beside the remote endpoint the prefix settings are the endpoint's (its model's own
        # words, such as "search_query: "), so a bundled model takes only its profile's.
        run = _RunSpec.of(s, profile, prefix_settings=not (uses_remote(s.embedding_model) and not s.embedding_model_dir))
        model_path = folder / MODEL_FILE
        if not model_path.is_file() or model_path.stat().st_size == 0:
            raise Disable("model_file_missing", str(model_path))
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise Disable("onnxruntime_not_importable", str(exc)) from None

        kind = run.kind
        if kind == "auto":
            kind = "hf-tokenizer" if (folder / TOKENIZER_FILE).is_file() else "use-string-input"

        options = ort.SessionOptions()
        options.intra_op_num_threads = inference_threads(s.embedding_intra_op_threads)
        options.inter_op_num_threads = 1
        # The CPU arena keeps the largest batch's tensors for the life of the session (and
        # by default grows in powers of two); without it they go back to malloc after each
        # call, where malloc_trim (embedding_trim_memory_seconds) can return them to the OS.
        options.enable_cpu_mem_arena = s.embedding_cpu_mem_arena
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle worker threads must not spin: the service mostly waits between small batches.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Shape-merge notices of the graph optimiser are warnings, not faults; errors still log.
        options.log_severity_level = 3

        tokenizer = None
        if kind == "use-string-input":
            try:
                import onnxruntime_extensions
            except ImportError as exc:
                raise Disable("onnxruntime_extensions_not_importable", str(exc)) from None
            options.register_custom_ops_library(onnxruntime_extensions.get_library_path())
        else:
            tokenizer_path = folder / TOKENIZER_FILE
            if not tokenizer_path.is_file():
                raise Disable("tokenizer_file_missing", str(tokenizer_path))
            try:
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise Disable("tokenizers_not_importable", str(exc)) from None
            try:
                tokenizer = Tokenizer.from_file(str(tokenizer_path))
                tokenizer.no_padding()
                tokenizer.enable_truncation(max_length=run.max_length)
            except Exception as exc:  # noqa: BLE001
                raise Disable("tokenizer_setup_failed", f"{type(exc).__name__}: {exc}") from None

        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        output_name = self._pick_output(session, profile)
        backend: Backend
        if kind == "use-string-input":
            strings = [i.name for i in session.get_inputs() if i.type == "tensor(string)"]
            if len(session.get_inputs()) != 1 or len(strings) != 1:
                raise Disable("unsupported_model", "a use-string-input model needs exactly one string tensor input")
            backend = StringInputBackend(session, strings[0], output_name, s)
        else:
            backend = TokenizerBackend(session, tokenizer, output_name, s, pooling=run.pooling)

        probe = backend.infer([_PROBE_TEXT])
        if probe.ndim != 2 or probe.shape[0] != 1 or probe.shape[1] < 1 or not np.isfinite(probe).all():
            raise Disable("unsupported_model", f"probe inference gave shape {probe.shape}")
        dim = int(probe.shape[1])
        return backend, self._make_model_id(folder, profile, kind, dim, run), dim, (run.query_prefix, run.passage_prefix)

    def _pick_output(self, session: Any, profile: dict[str, Any]) -> str:
        names = [o.name for o in session.get_outputs()]
        wanted = self._settings.embedding_output_name or profile.get("output_name") or ""
        if wanted:
            if wanted not in names:
                raise Disable("unsupported_model", f"model has no output {wanted!r} (outputs: {', '.join(names)})")
            return str(wanted)
        if not names:
            raise Disable("unsupported_model", "model has no outputs")
        return str(names[0])

    def _make_model_id(self, folder: Path, profile: dict[str, Any], kind: str, dim: int, run: _RunSpec) -> str:
        s = self._settings
        given = profile.get("model_id")
        name = given if isinstance(given, str) else folder.name
        name = _NAME_UNSAFE.sub("_", name).strip("_-") or "model"
        model_sha = _file_sha256(folder / MODEL_FILE)
        # Everything else that changes the vectors is folded into the digest; for a bare
        # model the digest is the model file's own sha256.
        extras: list[str] = []
        if (folder / EXTERNAL_DATA_FILE).is_file():
            extras.append("data:" + _file_sha256(folder / EXTERNAL_DATA_FILE))
        if kind == "hf-tokenizer":
            extras.append("tokenizer:" + _file_sha256(folder / TOKENIZER_FILE))
            extras.append(f"output:{s.embedding_output_name}")
        if run.query_prefix or run.passage_prefix:
            extras.append("prefixes:" + json.dumps([run.query_prefix, run.passage_prefix]))
        digest = model_sha
        if extras:
            digest = hashlib.sha256("\n".join(["model:" + model_sha, *extras]).encode("utf-8")).hexdigest()
        suffix = f"-{run.pooling}-mlen{run.max_length}" if kind == "hf-tokenizer" else ""
        return f"{name}-{dim}d{suffix}-{digest[:_DIGEST_CHARS]}"

    # -- inference --------------------------------------------------------------------

    def embed(self, texts: Sequence[str], kind: EmbedKind = "passage", expires: float | None = None) -> npt.NDArray[np.float32]:
        """Embed texts into float32 [len(texts), dim] rows of unit L2 norm (same order).

        Texts are cut to embedding_max_text_chars and get the query or passage prefix. The
        call waits for the inference thread, where it goes after any user query
        (:meth:`embed_for_user`) and, for passages, after background queries too.
        Raises EmbeddingsUnavailable when the service is not ready, and also when inference
        fails (which disables the service for the process). ``expires`` (``time.monotonic()``):
        texts still waiting for the model then are not embedded and RequestExpired is raised
        (the service stays ready). Raises TypeError for a non-str item and ValueError for an
        unknown kind.
        """
        cut, dim = self._prepare(texts, kind)
        if not cut:
            return np.zeros((0, dim), dtype=np.float32)
        started = time.monotonic()
        try:
            if kind == "query":
                vectors = self._batcher.call(cut, _BACKGROUND_QUERIES, expires)
            else:
                # Passages go in chunks, each its own request: a query that arrives meanwhile
                # waits for one chunk at most, not for a whole backfill batch. Not with a model
                # whose vectors depend on their batch-mates (use): there the call stays one
                # request, so its texts are batched (and their vectors come out) as before.
                invariant = all(slot.backend.batch_invariant for slot in self._slots)
                step = self._settings.embedding_passage_chunk_texts if invariant else max(1, len(cut))
                chunks = [self._batcher.submit(cut[lo : lo + step], _PASSAGES, expires) for lo in range(0, len(cut), step)]
                vectors = np.concatenate([chunk.wait() for chunk in chunks], axis=0)
        except RequestExpired:
            log.debug("embedding of %d texts (%s) expired in the queue", len(cut), kind)
            raise
        except (EmbeddingsUnavailable, BatcherClosed) as exc:
            self._observe(kind, len(cut), time.monotonic() - started, False)
            raise EmbeddingsUnavailable("disabled", self._reason) from exc
        self._observe(kind, len(cut), time.monotonic() - started, True)
        log.debug("embedded %d texts (%s) in %.1f ms", len(cut), kind, (time.monotonic() - started) * 1000)
        return vectors

    def embed_for_user(self, texts: Sequence[str], on_done: QueryDone, expires: float | None = None) -> None:
        """Embed a user's query texts ahead of all other work, without holding a thread.

        Returns at once; ``on_done(vectors, None)`` or ``on_done(None, error)`` is called
        once, on the inference thread (it must be quick), with vectors as :meth:`embed`
        gives them for kind "query". ``expires``: as for :meth:`embed` (the error is then
        RequestExpired). Raises EmbeddingsUnavailable (when not ready) and TypeError at once.
        """
        cut, dim = self._prepare(texts, "query")
        if not cut:
            on_done(np.zeros((0, dim), dtype=np.float32), None)
            return
        started = time.monotonic()

        def finished(pending: Pending[_Item, npt.NDArray[np.float32]]) -> None:
            error = pending.error
            if error is None:
                self._observe("query", len(cut), time.monotonic() - started, True)
                on_done(pending.answer, None)
                return
            if not isinstance(error, RequestExpired):
                self._observe("query", len(cut), time.monotonic() - started, False)
                error = EmbeddingsUnavailable("disabled", self._reason)
            on_done(None, error)

        try:
            self._batcher.submit(cut, _USER_QUERIES, expires, finished)
        except BatcherClosed as exc:
            raise EmbeddingsUnavailable("disabled", self._reason) from exc

    def _prepare(self, texts: Sequence[str], kind: str) -> tuple[list[_Item], int]:
        """The texts as batch items (cut to embedding_max_text_chars) and the dimension;
        raises ValueError, TypeError or EmbeddingsUnavailable as :meth:`embed` documents."""
        if kind not in ("query", "passage"):
            raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}")
        if isinstance(texts, str):
            raise TypeError("texts must be a list of strings, not a single string")
        items = list(texts)
        for item in items:
            if not isinstance(item, str):
                raise TypeError(f"texts must be strings, got {type(item).__name__}")
        with self._lock:
            slots, dim = self._slots, self._dim
            if self._state != "ready" or not slots or dim is None:
                raise EmbeddingsUnavailable(self._state, self._reason)
        limit = self._settings.embedding_max_text_chars
        return [("query" if kind == "query" else "passage", item[:limit]) for item in items], dim

    def _run_batch(self, batch: list[Pending[_Item, npt.NDArray[np.float32]]]) -> list[npt.NDArray[np.float32] | BaseException]:
        """Embed the requests of one micro-batch (on the inference thread): one [n, dim]
        array per request. A model whose vectors do not depend on their batch-mates
        (``Backend.batch_invariant``) embeds all the requests' texts in one call; any other
        runs each request's texts on their own, as that request alone would have. A failure
        of a bundled model disables the service and raises EmbeddingsUnavailable. The remote
        endpoint's request runs on its own thread meanwhile (:meth:`_remote_rows`); when it
        fails beside bundled models, a query request gets zeros in its columns and any other
        request the error (EmbeddingsUnavailable) as its answer; alone, the batch raises it."""
        slots = self._slots
        if not slots:
            raise EmbeddingsUnavailable(self._state, self._reason)
        parts: list[list[np.ndarray]] = [[] for _ in batch]
        answers: list[npt.NDArray[np.float32] | BaseException | None] = [None] * len(batch)
        started = time.monotonic()
        texts_of = [
            [[(slot.query_prefix if kind == "query" else slot.passage_prefix) + text for kind, text in p.items] for p in batch]
            for slot in slots
        ]
        # The endpoint's request goes out first, so it runs while the bundled models infer.
        remote = {
            i: slot.backend.start([t for request in texts_of[i] for t in request])
            for i, slot in enumerate(slots)
            if isinstance(slot.backend, RemoteEmbeddingBackend)
        }
        remote_ok = True
        try:
            for i, slot in enumerate(slots):
                texts = texts_of[i]
                raws: list[np.ndarray | None]
                if i in remote:
                    raws = self._remote_rows(remote[i], batch, texts, slot, alone=len(slots) == 1)
                    remote_ok = all(raw is not None for raw in raws)
                elif slot.backend.batch_invariant:
                    flat = [text for request in texts for text in request]
                    raw_all = slot.backend.infer(flat)
                    if raw_all.shape != (len(flat), slot.dim):
                        raise ValueError(f"embeddings have shape {raw_all.shape}, expected {(len(flat), slot.dim)}")
                    bounds = np.cumsum([0, *(len(request) for request in texts)])
                    raws = [raw_all[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
                else:
                    raws = [slot.backend.infer(request) for request in texts]
                for j, (part, raw, request) in enumerate(zip(parts, raws, texts, strict=True)):
                    if raw is None:
                        if all(kind == "query" for kind, _ in batch[j].items):
                            part.append(np.zeros((len(request), slot.dim), dtype=np.float32))  # this leg finds nothing
                        else:
                            answers[j] = EmbeddingsUnavailable("ready", self._error)
                        continue
                    if raw.shape != (len(request), slot.dim):
                        raise ValueError(f"embeddings have shape {raw.shape}, expected {(len(request), slot.dim)}")
                    if not np.isfinite(raw).all():
                        raise ValueError("model produced non-finite values")
                    norms = np.linalg.norm(raw, axis=1, keepdims=True)
                    part.append(raw / np.maximum(norms, np.finfo(np.float32).tiny) * slot.leg.weight)
        except RemoteEmbeddingError as exc:
            # The user's endpoint (alone) failed this call: the service stays ready and tries again.
            raise EmbeddingsUnavailable("ready", f"remote_failed: {exc}") from exc
        except Exception as exc:
            for future in remote.values():
                future.cancel()
            self._disable(f"inference_raised: {type(exc).__name__}: {exc}")
            raise EmbeddingsUnavailable("disabled", self._reason) from exc
        if remote_ok and self._error is not None:
            self._error = None  # the endpoint answers again
        log.debug(
            "inference batch: %d requests, %d texts in %.1f ms",
            len(batch),
            sum(len(p.items) for p in batch),
            (time.monotonic() - started) * 1000,
        )
        return [
            answer if answer is not None else np.concatenate(part, axis=1).astype(np.float32, copy=False)
            for answer, part in zip(answers, parts, strict=True)
        ]

    def _remote_rows(
        self,
        future: Future[np.ndarray],
        batch: list[Pending[_Item, npt.NDArray[np.float32]]],
        texts: list[list[str]],
        slot: _Slot,
        alone: bool,
    ) -> list[np.ndarray | None]:
        """The endpoint's rows of each request of ``batch``, waited for until the request's
        own timeout, or, when the batch holds requests with an expiry (queries), until
        _REMOTE_WAIT_SHARE of the time left to the earliest one. On failure: None per
        request beside bundled models (the failure is kept as ``error``); alone, raises
        RemoteEmbeddingError."""
        expiries = [p.expires for p in batch if p.expires is not None]
        wait = None if not expiries else max(0.0, (min(expiries) - time.monotonic()) * _REMOTE_WAIT_SHARE)
        try:
            raw_all = future.result(timeout=wait)
            count = sum(len(request) for request in texts)
            if raw_all.shape != (count, slot.dim) or not np.isfinite(raw_all).all():
                raise RemoteEmbeddingError(
                    f"the endpoint answered shape {raw_all.shape}, expected {(count, slot.dim)}, or non-finite values"
                )
        except (FutureTimeout, CancelledError, RemoteEmbeddingError) as exc:
            future.cancel()
            reason = str(exc) if isinstance(exc, RemoteEmbeddingError) else "no answer before the queries' deadline"
            self._error = f"remote_failed: {reason}"
            if alone:
                raise RemoteEmbeddingError(reason) from None
            log.debug("embedding endpoint failed a batch (%s); its leg is left out", reason)
            return [None] * len(batch)
        bounds = np.cumsum([0, *(len(request) for request in texts)])
        return [raw_all[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def _after_batch(self, requests: int, texts: int) -> None:
        """On the inference thread after each batch: when nothing else waits, give the heap
        memory the batch freed back to the OS (at most once per embedding_trim_memory_seconds)."""
        if self._trim is None or self._batcher.waiting():
            return
        now = time.monotonic()
        if now - self._trimmed_at >= self._settings.embedding_trim_memory_seconds:
            self._trimmed_at = now
            self._trim()

    def _observe(self, kind: str, texts: int, seconds: float, ok: bool) -> None:
        for observer in self._observers:
            observer(kind, texts, seconds, ok)

    def embed_one(self, text: str, kind: EmbedKind = "passage") -> npt.NDArray[np.float32]:
        """Embed one text into a float32 [dim] unit vector; raises like embed."""
        row: npt.NDArray[np.float32] = self.embed([text], kind)[0]
        return row


_Item = tuple[EmbedKind, str]
# Micro-batch priorities: a user waiting, then background queries (dedup, refinement),
# then passages (the vector backfill).
_USER_QUERIES = 0
_BACKGROUND_QUERIES = 1
_PASSAGES = 2


def inference_threads(setting: int) -> int:
    """Intra-op threads for a model session: ``setting`` when it is positive, else the
    physical cores this process may run on (hyper-threads share a core's vector units, so
    a second thread per core adds contention, not speed)."""
    if setting > 0:
        return setting
    try:
        allowed = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)
    cores: set[str] = set()
    for cpu in allowed:
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        cores.add(siblings)
    return max(1, len(cores))


def inference_workers(setting: int, intra_op: int) -> int:
    """Threads that run model calls at once: ``setting`` when positive, else as many as the
    physical cores hold with each call's ``intra_op`` threads (at least one)."""
    if setting > 0:
        return setting
    return max(1, inference_threads(0) // max(1, inference_threads(intra_op)))


def _heap_trimmer() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)`` (returns free heap pages of every malloc arena to the OS),
    or None where the C library has none."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)


@dataclass(frozen=True)
class _RunSpec:
    """How one model runs: from its profile where it says, else from the settings."""

    kind: str
    pooling: str
    max_length: int
    query_prefix: str
    passage_prefix: str

    @classmethod
    def of(cls, s: EmbeddingSettings, profile: dict[str, Any], prefix_settings: bool = True) -> _RunSpec:
        def pick(key: str, default: Any, kind: type) -> Any:
            value = profile.get(key)
            return value if isinstance(value, kind) and not isinstance(value, bool) else default

        kind = pick("kind", s.embedding_model_kind, str)
        pooling = pick("pooling", s.embedding_pooling, str)
        return cls(
            kind=kind if kind in ("auto", "use-string-input", "hf-tokenizer") else s.embedding_model_kind,
            pooling=pooling if pooling in ("mean", "cls", "last") else s.embedding_pooling,
            max_length=min(pick("max_length", s.embedding_max_length, int), s.embedding_max_length),
            query_prefix=pick("query_prefix", s.embedding_query_prefix if prefix_settings else "", str),
            passage_prefix=pick("passage_prefix", s.embedding_passage_prefix if prefix_settings else "", str),
        )
