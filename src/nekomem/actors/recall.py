"""RecallActor: the read-optimised lexical and vector indexes over facts and reflections.

The owners (FactActor, ReflectionActor) feed it with :class:`IndexUpsert` /
:class:`IndexRemove`; it keeps, for one character:

- every searchable entry of the tiers ``fact``, ``reflection`` and ``fact_archive`` in a
  BM25 :class:`~nekomem.recall.lexical.LexicalIndex`;
- a :class:`~nekomem.recall.vectors.VectorIndex` over the ``fact`` and ``reflection``
  entries, while the process embedding service is ready. A vector cached on the entry is
  reused when its model id and text sha256 still match; the others are computed in bounded
  batches on the model pool (never inside the mailbox) and handed back to their owner
  (:class:`VectorsComputed`) so that they are cached on the entries.

It answers user recall (:class:`QueryMemory`, the ``/query_memory`` contract) and the
background maintenance recall of the long-term pipeline (:class:`RankForStage2`,
:class:`RelatedFacts`, answered with :class:`RecallAnswer` through ``ctx.send``). A query
that needs its own embedding submits it to the pool and finishes when the vector comes back
(or, after ``recall_query_embed_timeout_seconds``, from BM25 alone). Nothing is persisted:
the indexes are rebuilt from the owners' stores at every activation.
"""

from __future__ import annotations

import heapq
import itertools
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone, tzinfo
from typing import Any

import msgspec
import numpy as np

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import (
    Flush,
    IndexEntry,
    IndexRemove,
    IndexUpsert,
    Message,
    Tick,
    VectorsComputed,
)
from nekomem.domain.subjects import Subject, SubjectIndex, restrict, row_fields
from nekomem.recall import vector_codec
from nekomem.recall.embeddings import text_sha256
from nekomem.recall.fusion import leg_top, rrf
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.timewindow import TimeWindow, parse_time_window
from nekomem.recall.tokenize import normalise, strip_stop_names
from nekomem.recall.vectors import VectorIndex
from nekomem.runtime.pool import PoolFull

TIERS = ("fact", "reflection", "fact_archive")
VECTOR_TIERS = ("fact", "reflection")
# replace_tier names a family: "fact" is the active store and its archive (one owner).
TIER_FAMILIES = {"fact": ("fact", "fact_archive"), "fact_archive": ("fact", "fact_archive"), "reflection": ("reflection",)}
OWNERS = {"fact": "facts", "fact_archive": "facts", "reflection": "reflections"}
ERROR_CODE = "hybrid_recall_failed"
PENDING_HOOK = "embedding_pending"


# -- messages ------------------------------------------------------------------------------
class QueryMemory(Message):
    """User recall (``/query_memory``). ``now`` is the caller's clock in the display time
    zone (time expressions resolve against it); ``reply`` gets the response dict."""

    query: str = ""
    time: str = ""
    now: datetime | None = None
    subjects: list[Subject] | None = None  # None: the private corpus (nekomem.domain.subjects)


class RankForStage2(Message):
    """Stage-2 coarse rank: ``candidate_ids`` (confirmed/promoted reflections and
    non-protected persona, in evidence order) ranked by their best cosine to any of
    ``query_texts``, cut to ``recall_coarse_oversample * budget``. Candidates the index has
    no vector for (persona entries) keep the given order in a reserved quota; pass their
    texts in ``candidate_texts`` to have them embedded too. Without vectors or queries the
    answer is the given order. Answered with ``RecallAnswer(tag, ids)`` sent to
    ``reply_child`` (and through ``reply`` when set)."""

    query_texts: list[str]
    candidate_ids: list[str]
    budget: int
    reply_child: str = ""
    tag: str = ""
    candidate_texts: dict[str, str] = {}


class RelatedFacts(Message):
    """Synthesis related context: the ``per_query_k`` entries nearest to each query text
    (cosine), merged round-robin (every query's first before anyone's second), deduplicated,
    capped at ``cap``; ``tiers`` limits the pool, ``exclude_ids`` removes entries (e.g. the
    batch's own facts). Empty without vectors. Answered like :class:`RankForStage2`."""

    query_texts: list[str]
    per_query_k: int
    cap: int
    reply_child: str = ""
    tag: str = ""
    tiers: list[str] = msgspec.field(default_factory=lambda: list(VECTOR_TIERS))
    exclude_ids: list[str] = []


class RecallAnswer(Message):
    """The answer of a maintenance recall: ``ids`` best first, ``tag`` as given."""

    tag: str
    ids: list[str]


class RequestIndex(Message):
    """Sent by a restarted RecallActor to the owners: please resend your complete
    IndexUpsert (with replace_tier), my in-memory index was lost with the crash."""


class _QueryVector(Message):
    token: int
    vector: Any
    error: str | None


class _QueryExpired(Message):
    token: int


class _BackfillDone(Message):
    token: int
    items: list[tuple[str, str]]  # (id, text sha256) in batch order
    vectors: Any
    error: str | None


class _MaintenanceVectors(Message):
    token: int
    vectors: Any
    error: str | None


# -- query and document text analysis ------------------------------------------------------
# Lexical text goes through these before the BM25 index (documents and queries alike): the
# stop names are stripped, then plain ASCII words are cut to a light English stem, so that
# "researched", "researching" and "research" meet. Queries also lose English function words
# ("what did ... do"), which otherwise match unrelated memories by chance. CJK, Hangul and
# other scripts pass through untouched (the index's tokenizer makes their n-grams).

_ASCII_WORD = re.compile(r"[a-z]+")
_WORD_SPLIT = re.compile(r"[a-z]+|[^a-z]+")
_VOWEL = re.compile(r"[aeiouy]")
QUERY_STOPWORDS = frozenset("""
a an the and or but if of to in on at by for with from about as into through after over between out during
without before under around among is are was were be been being am do does did doing done have has had having
will would shall should can could may might must what when where which who whom whose why how that this these
those there here i me my mine we us our ours you your yours he him his she her hers it its they them their
theirs not no so than too very just also only both each any all some such more most other another ever
""".split())


def light_stem(word: str) -> str:
    """A light English stem of a lowercase ASCII word (plural, -ed, -ing, -ly, final e).

    Words of three letters or fewer are kept. Deterministic, so documents and queries meet.
    """
    if len(word) <= 3:
        return word
    w = word
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 4:
        w = w[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and _VOWEL.search(w[: -len(suffix)]):
            w = w[: -len(suffix)]
            if suffix.startswith(("ing", "ed")) and len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # stopped -> stop, planned -> plan
            break
    if w.endswith("ied") and len(w) > 4:
        w = w[:-3] + "y"
    if w.endswith("e") and len(w) > 4:
        w = w[:-1]  # create / creating / created -> creat
    return w


def lexical_text(text: str, stop_names: tuple[str, ...], min_name_chars: int, *, stem: bool, query_stopwords: bool = False) -> str:
    """``text`` as the lexical index sees it (see the comment above)."""
    norm = normalise(text)
    if stop_names:
        norm = strip_stop_names(norm, stop_names, min_name_chars)
    if not stem and not query_stopwords:
        return norm
    out: list[str] = []
    for piece in _WORD_SPLIT.findall(norm):
        if not _ASCII_WORD.fullmatch(piece):
            out.append(piece)
        elif query_stopwords and piece in QUERY_STOPWORDS:
            out.append(" ")
        else:
            out.append(light_stem(piece) if stem else piece)
    return "".join(out)


_TIMEISH = re.compile(
    r"\d|today|tonight|yesterday|tomorrow|morning|afternoon|evening|night|week|weekend|month|year|ago|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april|may|june|"
    r"july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|"
    r"mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun",
    re.I,
)
# Single English words that are names of a month or a weekday but usually mean something
# else in a sentence ("may", "march", "sun"): never a time hint on their own.
_AMBIGUOUS_ALONE = frozenset(
    "may march sat sun wed mon tue tues thu thur thurs fri jan feb mar apr jun jul aug sep sept oct nov dec "
    "second night morning evening week month year weekend".split()
)
_TIME_FILLERS = frozenset("the in on at during over around by of".split())
_CJK_TIME_CHARS = re.compile(r"[0-9〇零一二两兩三四五六七八九十百年月日号號周週天昨今明先来來上下去前后後半夜晚朝昼午曜]")
_SPACELESS_RUN = re.compile(r"[^\sA-Za-z]+")


def query_time_hint(query: str, now: datetime, max_tokens: int, max_attempts: int) -> tuple[TimeWindow | None, str]:
    """A time expression inside a query ("what did I eat on 8 December 2023", "昨日何を
    食べた") as a window, and the query without it. The longest span that parses wins;
    ``(None, query)`` when there is none. At most ``max_attempts`` parses are tried."""
    attempts = 0
    best: tuple[int, int, int, TimeWindow] | None = None  # (length, start, end, window) in characters
    tokens = [(m.start(), m.end()) for m in re.finditer(r"\S+", query)]
    for i in range(len(tokens)):
        for j in range(min(len(tokens), i + max_tokens), i, -1):
            start, end = tokens[i][0], tokens[j - 1][1]
            span = query[start:end]
            if not _TIMEISH.search(span):
                continue
            words = [w for w in re.findall(r"[a-z]+|\d+", span.lower()) if w not in _TIME_FILLERS]
            if len(words) == 1 and words[0] in _AMBIGUOUS_ALONE:
                continue
            if best is not None and end - start <= best[0]:
                continue
            attempts += 1
            if attempts > max_attempts:
                break
            window = parse_time_window(span, now)
            if window is not None:
                best = (end - start, start, end, window)
                break
    # Spaceless scripts: substrings of CJK runs that contain a date-like character.
    for run in _SPACELESS_RUN.finditer(query):
        text = run.group()
        if not _CJK_TIME_CHARS.search(text) or text.isascii():
            continue
        for a in range(len(text)):
            if not _CJK_TIME_CHARS.match(text[a]):
                continue
            for b in range(min(len(text), a + 3 * max_tokens), a + 1, -1):
                if best is not None and b - a <= best[0]:
                    break
                attempts += 1
                if attempts > max_attempts:
                    break
                window = parse_time_window(text[a:b], now)
                if window is not None:
                    best = (b - a, run.start() + a, run.start() + b, window)
                    break
    if best is None:
        return None, query
    _, start, end, window = best
    rest = " ".join((query[:start] + " " + query[end:]).split())
    return window, rest


# -- process-wide helpers ------------------------------------------------------------------
class PendingCounter:
    """Entries waiting for a vector, per character; calling it gives the process total
    (registered as ``services.hooks["embedding_pending"]`` for /health)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def set(self, key: str, count: int) -> None:
        with self._lock:
            if count > 0:
                self._counts[key] = count
            else:
                self._counts.pop(key, None)

    def __call__(self) -> int:
        with self._lock:
            return sum(self._counts.values())


class _Deadlines:
    """One daemon thread that runs callbacks at real-time deadlines (query-embedding
    timeouts). Real time, not the injectable clock: the wait is for a model on this machine,
    and a ManualClock that never moves must not leave a query waiting forever."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def schedule(self, delay: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._seq), callback))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nekomem-recall-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                due, _, callback = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            try:
                callback()
            except Exception:  # noqa: BLE001 - a late timeout to a stopped actor is harmless
                pass


_DEADLINES = _Deadlines()


# -- entries -------------------------------------------------------------------------------
class _Doc:
    """One indexed entry and what recall needs of it, precomputed at upsert."""

    __slots__ = ("entry", "sha", "start", "end")

    def __init__(self, entry: IndexEntry, sha: str, start: float | None, end: float | None) -> None:
        self.entry = entry
        self.sha = sha
        self.start = start
        self.end = end


def _epoch(value: object, tz: tzinfo) -> float | None:
    """An ISO 8601 timestamp as epoch seconds (a naive one is read in ``tz``); None if unusable."""
    from nekomem.domain.messages import parse_iso

    parsed = parse_iso(value, tz)
    if parsed is None:
        return None
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def event_interval(entry: IndexEntry, tz: tzinfo) -> tuple[float | None, float | None]:
    """The entry's event as epoch ``(start, end)``: anchor = event end, else event start,
    else created_at; the interval is [start or anchor, end or anchor], swapped if reversed.
    ``(None, None)`` when no timestamp parses."""
    start = _epoch(entry.event_start_at, tz)
    end = _epoch(entry.event_end_at, tz)
    anchor = end if end is not None else start if start is not None else _epoch(entry.created_at, tz)
    if anchor is None:
        return None, None
    s = start if start is not None else anchor
    e = end if end is not None else anchor
    return (e, s) if e < s else (s, e)


def indexable(entry: IndexEntry) -> bool:
    """The shared hard filter as RecallActor applies it (the owner's verdict first)."""
    return (
        entry.searchable
        and entry.tier in TIERS
        and isinstance(entry.text, str)
        and bool(entry.text.strip())
        and not (entry.score < 0)
    )


def _display_tz(name: str) -> tzinfo:
    if name:
        try:
            from zoneinfo import ZoneInfo

            return ZoneInfo(name)
        except Exception:  # noqa: BLE001 - a bad zone name falls back to local time
            pass
    local = datetime.now().astimezone().tzinfo
    return local if local is not None else timezone.utc


def empty_response(query: str, *, error: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"results": [], "query": query, "candidates_total": 0, "elapsed_ms": 0.0}
    if error:
        body["error_code"] = ERROR_CODE
    return body


class _PendingQuery:
    """A query between its submission and its answer (waiting for its embedding).

    ``search`` is the text searched (the query without a time expression found in it);
    ``allowed`` the hard window filter of an explicit ``time``; ``hinted`` the entries inside
    a window named by the query itself (they get their own pair of legs).
    """

    __slots__ = ("msg", "query", "search", "window", "allowed", "hinted", "started")

    def __init__(self, msg: QueryMemory, query: str, search: str, window: TimeWindow | None,
                 allowed: set[str] | None, hinted: set[str] | None, started: float) -> None:
        self.msg = msg
        self.query = query
        self.search = search
        self.window = window
        self.allowed = allowed
        self.hinted = hinted
        self.started = started


class RecallActor(ChildActor):
    child_name = "recall"

    # -- lifecycle -------------------------------------------------------------------
    def load(self) -> None:
        s = self.ctx.settings.recall
        self.s = s
        self.tz = _display_tz(self.ctx.settings.server.display_timezone)
        names = [self.ctx.settings.recent.master_name, self.ctx.name, *s.recall_extra_stop_names]
        self.stop_names = tuple(sorted({normalise(n).strip() for n in names if n and n.strip()}))
        self.docs: dict[str, _Doc] = {}
        self.subject_index = SubjectIndex()
        # Stop names are stripped by lexical_text, before stemming, so the index gets none.
        self.lexical = LexicalIndex(s)
        self.vectors: VectorIndex | None = None
        self.vector_model: str | None = None
        self.need: dict[str, str] = {}  # id -> sha of the text waiting for a vector
        self.backfill_token: int | None = None
        self.backfill_items: list[tuple[str, str]] = []
        self.backfill_after = 0.0
        self.queries: dict[int, _PendingQuery] = {}
        self.maintenance: dict[int, Any] = {}
        self._seq = 0
        self._time_cache: tuple[list[str], np.ndarray, np.ndarray] | None = None
        hooks = self.ctx.services.hooks
        counter = hooks.get(PENDING_HOOK)
        if not isinstance(counter, PendingCounter):
            counter = PendingCounter()
            hooks[PENDING_HOOK] = counter
        self.pending_counter = counter
        # The context outlives a crash of this actor: a second load is a restart, and the
        # index died with the old instance, so the owners are asked to send it again.
        generation = self.ctx.__dict__.get("recall_generation", 0)
        self.ctx.__dict__["recall_generation"] = generation + 1
        if generation:
            for owner in ("facts", "reflections"):
                self.ctx.send(owner, RequestIndex())

    def close(self) -> None:
        self.pending_counter.set(self.ctx.name, 0)
        for pending in self.queries.values():
            if pending.msg.reply is not None:
                pending.msg.reply.ok(empty_response(pending.query, error=True))
        self.queries.clear()

    def on_Tick(self, msg: Tick) -> None:
        self._safe_sync()

    def _safe_sync(self) -> None:
        # The vector side is optional: a failure there is logged, never a crash loop.
        try:
            self._sync_vectors()
        except Exception:
            self.log.exception("vector index upkeep failed")

    def on_Flush(self, msg: Flush) -> None:
        if msg.reply is not None:
            msg.reply.ok(True)

    # -- feed ------------------------------------------------------------------------
    def on_IndexUpsert(self, msg: IndexUpsert) -> None:
        if msg.replace_tier is not None:
            family = TIER_FAMILIES.get(msg.replace_tier, (msg.replace_tier,))
            keep = {e.id for e in msg.entries}
            for doc_id in [i for i, d in self.docs.items() if d.entry.tier in family and i not in keep]:
                self._drop(doc_id)
        for entry in msg.entries:
            self._put(entry)
        self._time_cache = None
        self._safe_sync()
        self._publish_pending()

    def on_IndexRemove(self, msg: IndexRemove) -> None:
        for doc_id in msg.ids:
            self._drop(doc_id)
        self._time_cache = None
        self._publish_pending()

    def _put(self, entry: IndexEntry) -> None:
        if not entry.id:
            return
        if not indexable(entry):
            self._drop(entry.id)
            return
        old = self.docs.get(entry.id)
        sha = old.sha if old is not None and old.entry.text == entry.text else text_sha256(entry.text)
        start, end = event_interval(entry, self.tz)
        self.docs[entry.id] = _Doc(entry, sha, start, end)
        self.subject_index.put(entry.id, entry)
        if old is None or old.entry.text != entry.text:
            if old is not None:
                self.lexical.remove(entry.id)
            self.lexical.add(entry.id, self._lexical_doc(entry.text))
        if self.vectors is None:
            return
        if entry.tier not in VECTOR_TIERS:
            self._vec_remove(entry.id)
            self.need.pop(entry.id, None)
            return
        if old is not None and old.sha == sha and entry.id in self.vectors:
            return
        if not self._adopt_cached(entry, sha):
            self._vec_remove(entry.id)
            self.need[entry.id] = sha

    def _drop(self, doc_id: str) -> None:
        if self.docs.pop(doc_id, None) is None:
            return
        self.subject_index.remove(doc_id)
        self.lexical.remove(doc_id)
        self.need.pop(doc_id, None)
        self._vec_remove(doc_id)

    def _lexical_doc(self, text: str) -> str:
        return lexical_text(text, self.stop_names, self.s.recall_stop_name_min_chars, stem=self.s.recall_stem_english)

    def _lexical_query(self, text: str) -> str:
        s = self.s
        stripped = lexical_text(text, self.stop_names, s.recall_stop_name_min_chars, stem=s.recall_stem_english,
                                query_stopwords=s.recall_query_stopwords)
        if s.recall_query_stopwords and not any(ch.isalnum() for ch in stripped):
            # Nothing but function words ("what did you do?"): search them rather than nothing.
            return lexical_text(text, self.stop_names, s.recall_stop_name_min_chars, stem=s.recall_stem_english)
        return stripped

    def _vec_put(self, doc_id: str, vec: Any) -> None:
        assert self.vectors is not None
        self.vectors.upsert(doc_id, vec)

    def _vec_remove(self, doc_id: str) -> None:
        if self.vectors is not None:
            self.vectors.remove(doc_id)

    # -- vectors ---------------------------------------------------------------------
    def _service(self) -> Any:
        emb = self.ctx.services.embeddings
        if emb is None or self.s.recall_legs == "bm25":
            return None
        return emb if getattr(emb, "is_ready", False) else None

    def _sync_vectors(self) -> None:
        """Bring the vector index in line with the embedding service, then backfill."""
        emb = self._service()
        model = emb.model_id if emb is not None else None
        if model is None:
            if self.vectors is not None and (self.ctx.services.embeddings is None or getattr(self.ctx.services.embeddings, "state", "") == "disabled"):
                self.vectors, self.vector_model = None, None
                self.need.clear()
                self._publish_pending()
            return
        if self.vector_model != model or self.vectors is None:
            self.vectors = VectorIndex(int(emb.dim), self.s)
            self.vector_model = model
            self.need.clear()
            for doc_id, doc in self.docs.items():
                if doc.entry.tier in VECTOR_TIERS and not self._adopt_cached(doc.entry, doc.sha):
                    self.need[doc_id] = doc.sha
            self._publish_pending()
        self._pump_backfill()

    def _adopt_cached(self, entry: IndexEntry, sha: str) -> bool:
        if self.vectors is None or entry.vector is None or entry.vector_model != self.vector_model or entry.text_sha256 != sha:
            return False
        vec = vector_codec.try_decode(entry.vector, self.vectors.dim)
        if vec is None:
            return False
        try:
            self._vec_put(entry.id, vec)
        except ValueError:
            return False
        return True

    def _next_token(self) -> int:
        self._seq += 1
        return self._seq

    def _pump_backfill(self) -> None:
        if self.backfill_token is not None or not self.need or self.vectors is None:
            return
        if time.monotonic() < self.backfill_after:
            return
        emb = self._service()
        if emb is None:
            return
        items: list[tuple[str, str]] = []
        texts: list[str] = []
        for doc_id in itertools.islice(self.need, self.s.recall_embed_batch_size):
            items.append((doc_id, self.need[doc_id]))
            texts.append(self.docs[doc_id].entry.text)
        token = self._next_token()

        def job() -> Any:
            return emb.embed(texts, "passage")

        def wrap(result: Any, error: BaseException | None) -> Any:
            return _BackfillDone(token=token, items=items, vectors=result, error=None if error is None else repr(error))

        try:
            self.ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            return
        for doc_id, _ in items:
            del self.need[doc_id]
        self.backfill_token = token
        self.backfill_items = items

    def on__BackfillDone(self, msg: _BackfillDone) -> None:
        if msg.token != self.backfill_token:
            return
        self.backfill_token = None
        if msg.error is not None or self.vectors is None:
            # Put the batch back (the entries still there and unchanged) and pause; a
            # disabled service clears the vector side on the next sync instead.
            for doc_id, sha in msg.items:
                doc = self.docs.get(doc_id)
                if doc is not None and doc.sha == sha and doc.entry.tier in VECTOR_TIERS:
                    self.need.setdefault(doc_id, sha)
            self.backfill_after = time.monotonic() + self.s.recall_backfill_retry_seconds
            self.log.info("vector backfill failed for %d entries; retrying later", len(msg.items))
            self._sync_vectors()
            self._publish_pending()
            return
        model = self.vector_model
        assert model is not None
        computed: dict[str, dict[str, tuple[str, str, str]]] = {}
        for (doc_id, sha), row in zip(msg.items, np.asarray(msg.vectors)):
            doc = self.docs.get(doc_id)
            if doc is None or doc.sha != sha or doc.entry.tier not in VECTOR_TIERS:
                continue  # removed or rewritten meanwhile; a newer request is queued if needed
            try:
                self._vec_put(doc_id, row)
                encoded = vector_codec.encode(row)
            except (ValueError, vector_codec.VectorCodecError):
                continue
            computed.setdefault(OWNERS[doc.entry.tier], {})[doc_id] = (encoded, model, sha)
        for owner, vectors in computed.items():
            self.ctx.send(owner, VectorsComputed(vectors=vectors))
        self._publish_pending()
        self._pump_backfill()

    def _publish_pending(self) -> None:
        inflight = len(self.backfill_items) if self.backfill_token is not None else 0
        self.pending_counter.set(self.ctx.name, len(self.need) + inflight if self.vectors is not None else 0)

    def _submit_embed(self, texts: list[str], wrap: Callable[[Any, BaseException | None], Any], *, urgent: bool = False) -> bool:
        """Embed ``texts`` as queries on the model pool; False when that is not possible.

        ``urgent`` (a user waiting) uses a pool key of its own, so that it never queues
        behind this character's (possibly slow) LLM jobs or its backfill batch; background
        work uses the character's key, which also keeps the character active meanwhile.
        """
        emb = self._service()
        if emb is None or self.vectors is None:
            return False

        def job() -> Any:
            return emb.embed(texts, "query")

        ctx = self.ctx
        try:
            if urgent:
                ctx.services.pool.submit(f"{ctx.name}\x00recall", job, lambda result, error: ctx.send(self.child_name, wrap(result, error)))
            else:
                ctx.submit_model_job(self.child_name, job, wrap)
        except PoolFull:
            return False
        return True

    # -- user recall -----------------------------------------------------------------
    def on_QueryMemory(self, msg: QueryMemory) -> None:
        if msg.reply is None:
            return
        started = time.perf_counter()
        query = (msg.query or "").strip()[: self.s.recall_query_max_chars]
        spec = (msg.time or "").strip()
        try:
            self._sync_vectors()
            now = msg.now or datetime.now(self.tz)
            window = parse_time_window(spec, now) if spec else None
            if window is None and spec:
                self.log.info("recall: time expression not understood; ignored")
            # Subject scoping is a hard filter applied before any scoring (fail closed).
            visible = self.subject_index.allowed(msg.subjects)
            if not query:
                msg.reply.ok(empty_response("") if window is None else self._time_only(window, spec, started, visible))
                return
            search, hinted = query, None
            if window is None and self.s.recall_query_time_hints:
                hint, rest = query_time_hint(query, now, self.s.recall_query_time_max_tokens, self.s.recall_query_time_max_attempts)
                if hint is not None:
                    hinted = restrict(self._in_window(hint), visible) or None
                    search = rest or query
            allowed = restrict(self._in_window(window) if window is not None else None, visible)
            pending = _PendingQuery(msg, query, search, window, allowed, hinted, started)
            if self.s.recall_legs != "bm25" and self.vectors is not None and len(self.vectors) and (allowed is None or allowed):
                token = self._next_token()

                def wrap(result: Any, error: BaseException | None) -> Any:
                    return _QueryVector(token=token, vector=result, error=None if error is None else repr(error))

                if self._submit_embed([search], wrap, urgent=True):
                    self.queries[token] = pending
                    me = self.actor_ref
                    _DEADLINES.schedule(self.s.recall_query_embed_timeout_seconds, lambda: me.tell(_QueryExpired(token=token)))
                    return
            self._finish(pending, None)
        except Exception:
            self.log.exception("recall query failed")
            msg.reply.ok(empty_response(query, error=True))

    def on__QueryVector(self, msg: _QueryVector) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is None:
            return  # answered already (timed out)
        vec = None
        if msg.error is None and msg.vector is not None:
            vec = np.asarray(msg.vector)[0]
        else:
            self.log.info("recall: query embedding failed; answering from BM25 alone")
        self._finish(pending, vec)

    def on__QueryExpired(self, msg: _QueryExpired) -> None:
        pending = self.queries.pop(msg.token, None)
        if pending is not None:
            self.log.info("recall: query embedding timed out; answering from BM25 alone")
            self._finish(pending, None)

    def _finish(self, pending: _PendingQuery, qvec: np.ndarray | None) -> None:
        try:
            body = self._query_search(pending, qvec)
        except Exception:
            self.log.exception("recall query failed")
            body = empty_response(pending.query, error=True)
        pending.msg.reply.ok(body)

    def _legs(self, lexical_query: str, qvec: np.ndarray | None, allowed: set[str] | None) -> list[list[str]]:
        """The lexical and the vector leg (ids, best first) over ``allowed`` (None: all)."""
        s = self.s
        lex_hits: list[tuple[str, float]] = []
        vec_hits: list[tuple[str, float]] = []
        if allowed is None or allowed:
            if s.recall_legs != "vector":
                lex_hits = self.lexical.search(lexical_query, s.recall_budget_each, allowed, min_score=s.recall_bm25_threshold)
            if qvec is not None and self.vectors is not None and s.recall_legs != "bm25":
                try:
                    vec_hits = self.vectors.search(qvec, s.recall_budget_each, allowed, min_score=s.recall_cosine_threshold)
                except ValueError:
                    vec_hits = []
        return [leg_top(lex_hits, s.recall_budget_each, s.recall_bm25_threshold), leg_top(vec_hits, s.recall_budget_each, s.recall_cosine_threshold)]

    def _query_search(self, pending: _PendingQuery, qvec: np.ndarray | None) -> dict[str, Any]:
        s = self.s
        allowed = pending.allowed
        pool_size = len(self.docs) if allowed is None else len(allowed)
        lexical_query = self._lexical_query(pending.search)
        legs = self._legs(lexical_query, qvec, allowed)
        if pending.hinted:
            # The query named a time: the same search inside that window adds two legs, so
            # entries of that time rank first without hiding the rest.
            legs += self._legs(lexical_query, qvec, pending.hinted)
        fused = rrf(legs, s.recall_rrf_k, s.recall_budget_total)
        results = [self._row(doc_id, round(score, 6)) for doc_id, score in fused if doc_id in self.docs]
        elapsed = round((time.perf_counter() - pending.started) * 1000, 1)
        self.log.info(
            "recall query: pool=%d vectors=%d bm25=%d cosine=%d fused=%d window=%s time_hint=%s embedding=%s elapsed_ms=%.1f",
            pool_size, 0 if self.vectors is None else len(self.vectors), len(legs[0]), len(legs[1]), len(results),
            pending.window is not None, pending.hinted is not None, "used" if qvec is not None else "none", elapsed,
        )
        self.log.debug("recall query %r -> %s", pending.query, [r["id"] for r in results])
        return {"results": results, "query": pending.query, "candidates_total": pool_size, "elapsed_ms": elapsed}

    def _row(self, doc_id: str, score: float | None) -> dict[str, Any]:
        e = self.docs[doc_id].entry
        return {
            "id": e.id,
            "text": e.text,
            "tier": e.tier,
            "entity": e.entity,
            "score": score,
            "created_at": e.created_at,
            "event_start_at": e.event_start_at,
            "event_end_at": e.event_end_at,
            **row_fields(e),
        }

    # -- time ------------------------------------------------------------------------
    def _time_arrays(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        if self._time_cache is None:
            ids = [i for i, d in self.docs.items() if d.start is not None]
            starts = np.fromiter((self.docs[i].start for i in ids), dtype=np.float64, count=len(ids))
            ends = np.fromiter((self.docs[i].end for i in ids), dtype=np.float64, count=len(ids))
            self._time_cache = (ids, starts, ends)
        return self._time_cache

    def _in_window(self, window: TimeWindow) -> set[str]:
        """Ids whose event interval overlaps ``window`` (start < window end, end >= start)."""
        ids, starts, ends = self._time_arrays()
        mask = (starts < window.end.timestamp()) & (ends >= window.start.timestamp())
        return {ids[i] for i in np.flatnonzero(mask).tolist()}

    def _time_only(self, window: TimeWindow, spec: str, started: float, visible: set[str] | None = None) -> dict[str, Any]:
        ids, starts, ends = self._time_arrays()
        if visible is not None:
            keep = np.fromiter((i in visible for i in ids), dtype=bool, count=len(ids))
            ids, starts, ends = [i for i, k in zip(ids, keep) if k], starts[keep], ends[keep]
        ws, we = window.start.timestamp(), window.end.timestamp()
        inside = (starts < we) & (ends >= ws)
        distance = np.where(inside, 0.0, np.where(ends < ws, ws - ends, starts - we))
        # Nearest first: inside before outside, then the gap, then the later event.
        order = np.lexsort((-starts, distance, (~inside).astype(np.int8)))[: self.s.recall_time_budget]
        results = [self._row(ids[i], None) for i in order.tolist()]
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        self.log.info("recall by time: pool=%d inside=%d returned=%d elapsed_ms=%.1f", len(ids), int(inside.sum()), len(results), elapsed)
        return {"results": results, "query": "", "time": spec, "candidates_total": len(ids), "elapsed_ms": elapsed}

    # -- maintenance recall ----------------------------------------------------------
    def _answer(self, msg: Any, ids: list[str]) -> None:
        if msg.reply_child:
            self.ctx.send(msg.reply_child, RecallAnswer(tag=msg.tag, ids=ids))
        if msg.reply is not None:
            msg.reply.ok(ids)

    def on_RankForStage2(self, msg: RankForStage2) -> None:
        self._sync_vectors()
        candidates = list(dict.fromkeys(c for c in msg.candidate_ids if c))
        k = max(msg.budget, 0) * self.s.recall_coarse_oversample
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        if k == 0 or not candidates:
            self._answer(msg, [])
            return
        extra = [c for c in candidates if (self.vectors is None or c not in self.vectors) and msg.candidate_texts.get(c, "").strip()]
        texts = queries + [msg.candidate_texts[c] for c in extra]
        token = self._next_token()

        def wrap(result: Any, error: BaseException | None) -> Any:
            return _MaintenanceVectors(token=token, vectors=result, error=None if error is None else repr(error))

        if queries and self._submit_embed(texts, wrap):
            self.maintenance[token] = ("stage2", msg, candidates, k, len(queries), extra)
            return
        self._answer(msg, candidates[:k])

    def on_RelatedFacts(self, msg: RelatedFacts) -> None:
        self._sync_vectors()
        queries = [q.strip() for q in msg.query_texts if isinstance(q, str) and q.strip()]
        token = self._next_token()

        def wrap(result: Any, error: BaseException | None) -> Any:
            return _MaintenanceVectors(token=token, vectors=result, error=None if error is None else repr(error))

        if queries and msg.per_query_k > 0 and msg.cap > 0 and self.vectors is not None and len(self.vectors) and self._submit_embed(queries, wrap):
            self.maintenance[token] = ("related", msg)
            return
        self._answer(msg, [])

    def on__MaintenanceVectors(self, msg: _MaintenanceVectors) -> None:
        job = self.maintenance.pop(msg.token, None)
        if job is None:
            return
        vectors = None if msg.error is not None or msg.vectors is None else np.asarray(msg.vectors, dtype=np.float32)
        if job[0] == "stage2":
            _, request, candidates, k, n_queries, extra = job
            self._answer(request, self._coarse_rank(candidates, k, vectors, n_queries, extra))
        else:
            _, request = job
            self._answer(request, [] if vectors is None else self._related(request, vectors))

    def _coarse_rank(self, candidates: list[str], k: int, vectors: np.ndarray | None, n_queries: int, extra: list[str]) -> list[str]:
        if vectors is None or self.vectors is None:
            return candidates[:k]
        queries = vectors[:n_queries]
        own = {c: vectors[n_queries + i] for i, c in enumerate(extra)}
        scored: list[tuple[float, int, str]] = []
        unembedded: list[str] = []
        for position, cid in enumerate(candidates):
            vec = own.get(cid)
            if vec is None:
                vec = self.vectors.get(cid)
            if vec is None:
                unembedded.append(cid)
                continue
            best = float(np.max(queries @ vec))
            scored.append((-best, position, cid))  # ties keep the given (evidence) order
        scored.sort()
        embedded = [cid for _, _, cid in scored]
        # Unembedded candidates keep a reserved share so that they are not starved.
        quota = min(len(unembedded), max(1, k // (self.s.recall_coarse_oversample + 1))) if unembedded else 0
        chosen = embedded[: k - quota] + unembedded[:quota]
        if len(chosen) < k:
            rest = embedded[k - quota :] + unembedded[quota:]
            chosen += rest[: k - len(chosen)]
        return chosen

    def _related(self, msg: RelatedFacts, vectors: np.ndarray) -> list[str]:
        assert self.vectors is not None
        tiers = set(msg.tiers)
        exclude = set(msg.exclude_ids)
        docs = self.docs

        def accept(doc_id: str) -> bool:
            doc = docs.get(doc_id)
            return doc is not None and doc.entry.tier in tiers and doc_id not in exclude

        per_query = [[i for i, _ in self.vectors.search(row, msg.per_query_k, accept)] for row in vectors]
        merged: list[str] = []
        seen: set[str] = set()
        for rank in range(msg.per_query_k):
            for hits in per_query:
                if rank < len(hits) and hits[rank] not in seen:
                    seen.add(hits[rank])
                    merged.append(hits[rank])
                    if len(merged) >= msg.cap:
                        return merged
        return merged

