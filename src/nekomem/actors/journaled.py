"""Base of the actors whose layer is event-backed (facts, reflections, persona).

Every change is first an event appended (fsync) to the character's journal, then applied
to the in-memory state; the JSON views are rewritten from that state in batches (after
``view_flush_changes`` changes or ``view_flush_seconds``), and the owner's applied mark
moves only after its views are on disk. So a change is durable as soon as its event is,
one change costs one journal append whatever the size of the store, and a crash between
journal and view is repaired at the next load by re-applying the events after the mark.
The flush cadence is real time, not the injectable clock: it is I/O batching, not domain
time. ``apply_event`` must be idempotent: applying an event twice has the effect of once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

from nekomem.actors.base import ChildActor
from nekomem.actors.handlers import handles
from nekomem.actors.messages import Flush, ModelDone, ScrubTexts, Tick
from nekomem.runtime.clock import iso
from nekomem.runtime.reply import Reply
from nekomem.stores.atomic import read_json
from nekomem.stores.erasure import drop_from_shards
from nekomem.stores.faults import classify
from nekomem.stores.journal import Event


class JournaledActor(ChildActor):
    owner: ClassVar[str] = ""

    # -- to implement ----------------------------------------------------------------
    def load_views(self) -> None:
        """Read this layer's views from disk into memory."""

    def write_views(self) -> None:
        """Write this layer's views from memory (atomically)."""

    def apply_event(self, event: Event) -> None:
        """Apply one of this owner's events to the in-memory state, idempotently."""

    def after_load(self) -> None:
        """Hook after views are loaded and the journal replayed."""

    # -- machinery -------------------------------------------------------------------
    def read_view(self, path: Path, default: Any) -> Any:
        """A view's content (see :func:`read_json`); a corrupt one (moved aside) is noted,
        so that :meth:`load` rebuilds it from the whole journal."""
        value, status = read_json(path, default=default)
        if status == "corrupt":
            self.note_corrupt(path)
        return value

    def note_corrupt(self, path: Path) -> None:
        """Record that the view ``path`` was undecodable (moved aside): :meth:`load`
        rebuilds it from the whole journal."""
        self._corrupt_views.append(path.name)

    def load(self) -> None:
        self._dirty = 0
        self._last_event: str | None = None
        self._last_flush = time.monotonic()
        self._flush_gap = 0.0
        self._corrupt_views: list[str] = []
        self.load_views()
        if self._corrupt_views:
            # Every event of this owner still in the journal, not just those after the
            # applied mark: handlers are idempotent, so replaying what the lost view
            # already held is safe.
            replay = self.ctx.journal.all_for(self.owner)
            self._report_rebuild(len(replay))
        else:
            replay = self.ctx.journal.unapplied_for(self.owner)
        for event in replay:
            self.apply_event(event)
        if replay:
            self.log.info("re-applied %d journaled events", len(replay))
            self._last_event = replay[-1].event_id
            self._dirty += len(replay)
            self.flush()
        self.after_load()

    def _report_rebuild(self, events: int) -> None:
        compacted_at = getattr(self.ctx.journal, "compacted_at", None)
        views = ", ".join(self._corrupt_views)
        if compacted_at is None:
            self.log.warning("rebuilt corrupt view(s) %s from %d journaled events", views, events)
            return
        self.log.warning("corrupt view(s) %s rebuilt only from events since the journal compaction", views)
        storage = self.ctx.services.storage
        if storage is not None:
            for view in self._corrupt_views:
                storage.unrebuilt(
                    self.ctx.name,
                    view,
                    f"rebuilt from the journal since its compaction at {compacted_at}; older entries of this view are lost "
                    "(the corrupt file was kept beside it as .corrupt-*)",
                )

    def now(self) -> datetime:
        return self.ctx.clock.now()

    def now_iso(self) -> str:
        return iso(self.ctx.clock.now())

    def powerful(self) -> bool:
        """The powerful-memory switch, re-read on every use."""
        switches = self.ctx.services.switches
        return switches.powerful_memory() if switches is not None else self.ctx.settings.longterm.powerful_memory_default

    def names(self) -> dict[str, str]:
        """Names for prompts: the user's and the character's."""
        return {"master_name": self.ctx.settings.recent.master_name, "ai_name": self.ctx.name}

    @staticmethod
    def edited_text(changes: Mapping[str, Any]) -> str:
        """The ``text`` of an API edit, stripped; raises ActorFailure 422 when it is not a
        non-empty string."""
        from nekomem.runtime.reply import ActorFailure

        text = changes.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ActorFailure("bad_text", "text must be a non-empty string", 422)
        return text.strip()

    def send_refine_clusters(self, clusters: list[tuple[dict[str, str], dict[str, Any]]], what: str) -> int:
        """Ask ``refine_cluster`` for each (members id -> text, extra context) until the
        pool refuses; the answers come back to ``done_refine``. Returns how many were sent."""
        from nekomem.domain import prompts_longterm as prompts

        sent = 0
        for members, extra in clusters:
            messages = prompts.refine_cluster_messages(list(members.items()), **self.names())
            token = self.ask_model(
                "refine",
                "refine_cluster",
                messages,
                context={**extra, "members": members},
                timeout=self.ctx.settings.longterm.longterm_refine_timeout_seconds,
            )
            if token is None:
                break
            self._refine_inflight += 1
            sent += 1
        if clusters:
            self.log.info("%s refinement: %d of %d clusters sent", what, sent, len(clusters))
        return sent

    def stop_names(self) -> list[str]:
        """Names removed before keyword matching (they are in every entry)."""
        return [self.ctx.settings.recent.master_name, self.ctx.name]

    def record(self, type: str, payload: Mapping[str, Any]) -> Event:
        """Journal one transition, apply it, and schedule the view write."""
        event = self.ctx.journal.append(type, payload, self.now_iso())
        self.apply_event(event)
        self._note(event)
        return event

    def record_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> list[Event]:
        ts = self.now_iso()
        batch = [(t, p, ts) for t, p in items]
        if not batch:
            return []
        events = self.ctx.journal.append_many(batch)
        for event in events:
            self.apply_event(event)
        self._dirty += len(events) - 1
        self._note(events[-1])
        return events

    def erase(self, ids: list[str], texts: list[str], archive_dir: Path | None, reply: Reply | None, answer: object) -> None:
        """Complete a forget whose tombstone is journaled: the views without ``ids`` go to
        disk now, then the journal drops every event about them (and every event holding
        one of ``texts``), the archive shards in ``archive_dir`` drop them, and the persona's
        contradiction queue and the outbox drop the texts, and the outbox answers ``reply``
        with ``answer``. In that order, so a crash
        at any step leaves the erasure applied (never a journal that would bring an erased
        entry back). Raises OSError."""
        self._dirty = max(getattr(self, "_dirty", 0), 1)
        self.flush()
        dropped = self.ctx.journal.purge(self.owner, ids, texts)
        shards = drop_from_shards(archive_dir, ids) if archive_dir is not None else 0
        self.log.info("erased %d entries: %d journal events and %d archived copies dropped", len(ids), dropped, shards)
        # The persona's contradiction queue may quote the text (a reflection's proposal):
        # the persona actor scrubs it, then passes the message on to the outbox.
        target = "outbox" if self.owner == "persona" else "persona"
        self.ctx.send(target, ScrubTexts(texts=texts, reply_value=answer, reply=reply))

    def _note(self, event: Event) -> None:
        self._dirty += 1
        self._last_event = event.event_id
        self._maybe_flush()

    @property
    def _views_layer(self) -> str:
        """The /health key of a view rewrite that failed after its changes were journaled."""
        return f"{self.child_name}_views"

    def _maybe_flush(self) -> None:
        rt = self.ctx.settings.runtime
        if not self._dirty:
            return
        since = time.monotonic() - self._last_flush
        # A big view costs a lot to rewrite: after a flush that took T seconds, wait at
        # least T / view_flush_max_duty, so rewrites never take more than that share of
        # the actor's time, however large the store (the journal keeps changes durable).
        if since < self._flush_gap:
            return
        if self._dirty >= rt.view_flush_changes or since >= rt.view_flush_seconds:
            try:
                self.flush()
            except Exception as exc:
                fault = classify(exc)
                if fault is None:
                    raise
                # Every change is already durable in the journal (and applied in memory):
                # the message that caused it succeeded. Only the view is behind; it is
                # rewritten at the next due time, and /health shows the fault until then.
                self._last_flush = time.monotonic()
                self.log.warning("%s: views not rewritten (%s); the journal holds the changes", self.child_name, fault.code)
                storage = self.ctx.services.storage
                if storage is not None:
                    storage.report(self.ctx.name, self._views_layer, fault)
                self._views_behind = True

    def flush(self) -> None:
        if not getattr(self, "_dirty", 0):
            return
        started = time.monotonic()
        self.write_views()
        self._flush_gap = (time.monotonic() - started) / self.ctx.settings.runtime.view_flush_max_duty
        if self._last_event is not None:
            self.ctx.journal.mark(self.owner, self._last_event)
        self._dirty = 0
        self._last_flush = time.monotonic()
        if getattr(self, "_views_behind", False):
            self._views_behind = False
            storage = self.ctx.services.storage
            if storage is not None:
                storage.clear(self.ctx.name, self._views_layer)
        self.ctx.journal.compact_if_applied(self.ctx.settings.runtime.events_compact_lines)

    def real_due_at(self) -> float | None:
        """The next view rewrite, when changes wait (see _maybe_flush)."""
        if not getattr(self, "_dirty", 0):
            return None
        return self._last_flush + max(self._flush_gap, self.ctx.settings.runtime.view_flush_seconds)

    @handles(Tick)
    def on_Tick(self, msg: Tick) -> None:
        self._maybe_flush()
        self.tick(msg)

    def tick(self, msg: Tick) -> None:
        """Periodic work of the layer (runs when the timer of ``due_at`` fires)."""

    @handles(ModelDone)
    def on_model_done(self, msg: ModelDone) -> None:
        self.on_ModelDone(msg)

    @handles(Flush)
    def on_Flush(self, msg: Flush) -> None:
        self.flush()
        if msg.reply is not None:
            msg.reply.ok(True)
