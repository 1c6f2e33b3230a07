"""Path A of the fact layer: post-turn records extracted for facts.

Post-turn work arrives from the outbox as RunOp. With powerful memory on, turns are
buffered and extracted in batches (``fact_extract_every_n_turns`` user turns, or
``fact_extract_interval_minutes`` since the last check, or idle); the outbox records stay
open until their turns were extracted, so a crash replays them. Off, each turn batch is
extracted on its own. Extracted facts are deduplicated by the store before they are
journaled. A record of the fact backlog (turns stored before a model could mine them)
tells RecentActor when it is mined, so the next backlog batch is handed out. Every
extraction that finished tells RecentActor which journal rows it covered (``TurnsMined``):
recall stops offering those turns as rows of their own
(:mod:`nekomem.stores.turn_coverage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

import msgspec

from nekomem.actors.messages import BacklogMined, ModelResult, NewFacts, OpFinished, OpParked, RunOp, TurnsMined
from nekomem.actors.ports import LayerPorts
from nekomem.domain import facts as fl
from nekomem.domain.extraction import ExtractionQueue, Op
from nekomem.domain.gates import task_gate
from nekomem.domain.layers import OUTBOX, RECENT, REFLECTIONS
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Fact
from nekomem.domain.turns import Turn, from_disk
from nekomem.layers.facts.state import FactStore
from nekomem.stores.fact_backlog import BACKLOG_ROWS_KEY, backlog_last_row

Mode = Literal["single", "batch"]


class ExtractDone(ModelResult, frozen=True):
    """An ``extract_facts`` job over the records ``ops`` finished (``batch``: a queued
    batch taken on ``trigger``; ``single``: one record extracted on its own)."""

    mode: Mode
    ops: list[Op]
    trigger: str = ""

    def turns(self) -> list[Turn]:
        """The turns of every record, in order."""
        return [t for _op, ts in self.ops for t in ts]


class FactExtraction:
    """The extraction queue (records waiting for a batch), the batch in flight and its
    gate, and the records that are batches of the fact backlog."""

    def __init__(self, ports: LayerPorts, store: FactStore) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = store
        self.queue = ExtractionQueue(self.s)  # records waiting for path A
        self.backlog_ops: dict[str, int] = {}  # op_id -> last row, of fact-backlog batches
        self.op_rows: dict[str, tuple[int, int]] = {}  # op_id -> the journal rows it holds
        self.inflight: int | None = None
        # Texts of turns forgotten while an extraction job had them (a job with the model
        # cannot be called back): its answer is not used and its turns are not put back.
        self.jobs = 0
        self.forgotten: set[str] = set()
        # A failed batch stays parked and is retried after a backoff (as the reference's
        # cursor stays put): a model outage delays extraction but never dead-letters turns.
        self.gate = task_gate(self.s)

    def reset(self) -> None:
        """Forget the queue and the batch in flight (a load: the outbox replays them)."""
        self.queue = ExtractionQueue(self.s)
        self.backlog_ops = {}
        self.op_rows = {}
        self.inflight = None
        self.jobs = 0
        self.forgotten = set()
        self.gate = task_gate(self.s)

    def drop_texts(self, texts: list[str]) -> int:
        """An erasure: the turns with these texts leave the waiting queue, and a job that
        has them now will neither be used nor put back (see :meth:`done`); returns how
        many waiting turns went."""
        if self.jobs:
            self.forgotten.update(t.strip() for t in texts)
        return self.queue.drop_texts(texts)

    def run_op(self, msg: RunOp) -> None:
        """Take one post-turn record: skip it (no user turn, or no model), queue it for a
        batch (powerful memory on, or already queued), or extract it at once."""
        turns = msg.turns
        if turns is None:
            raw = msg.payload.get("messages", [])
            parsed = (from_disk(m) for m in raw) if isinstance(raw, list) else ()
            turns = [t for t in parsed if t is not None]
        backlog = backlog_last_row(msg.payload)
        rows = _row_range(msg.payload)
        if rows is not None:
            self.op_rows[msg.op_id] = rows
        if backlog is not None:
            # A batch of the fact backlog (announced when stored): recent hears when it is mined.
            self.backlog_ops[msg.op_id] = backlog
        elif msg.attempt == 1 and turns:
            self.ports.announce_stored_turns(turns)
        user_turns = [t for t in turns if t.role == "human"]
        if not user_turns or not self.ports.model_available("extract_facts"):
            # Nothing a fact can come from, or no summary tier: the step is skipped
            # (reported by /health) and the record is finished; its turns stay uncovered.
            self.op_rows.pop(msg.op_id, None)
            self.op_done(msg.op_id)
            return
        if self.ports.powerful() or msg.op_id in self.queue:
            self.queue.add(msg.op_id, turns, self.ports.now(), backlog=msg.op_id in self.backlog_ops)
            # Held for a batch: free the outbox slot so the records behind it arrive.
            self.ports.send(OUTBOX, OpParked(op_id=msg.op_id))
            self.maybe_extract()
        else:
            self._extract("single", [(msg.op_id, turns)])

    def op_done(self, op_id: str) -> None:
        """Finish a post-turn record; for a batch of the fact backlog, tell recent it is mined."""
        self.ports.send(OUTBOX, OpFinished(op_id=op_id, ok=True))
        self.queue.finished(op_id)
        row = self.backlog_ops.pop(op_id, None)
        if row is not None:
            self.ports.send(RECENT, BacklogMined(row=row))

    def maybe_extract(self) -> None:
        """Send the queued batch to the model when one is due and the gate is open."""
        if self.inflight is not None or self.gate.blocked(self.ports.clock.monotonic()):
            return
        trigger = self.queue.due(self.ports.now())
        if trigger is not None:
            batch = self.queue.take(trigger)
            self.ports.log.info("batch extraction (%s): %d records", trigger, len(batch))
            self._extract("batch", batch, trigger)

    def _extract(self, mode: Mode, ops: list[Op], trigger: str = "") -> None:
        turns = [t for _op, ts in ops for t in ts]
        messages = prompts.extract_facts_messages(turns, now=self.ports.now(), **self.ports.names())
        token = self.ports.ask_model(
            "extract_facts",
            messages,
            lambda token, output, error: ExtractDone(token=token, output=output, error=error, mode=mode, ops=ops, trigger=trigger),
            timeout=self.s.longterm_extract_timeout_seconds,
        )
        if token is None:
            # Pool full: put the work back; the timer tries again after the retry floor.
            if mode == "batch":
                self.queue.put_back(ops, trigger)
            else:
                for op_id, _ in ops:
                    self.ports.send(OUTBOX, OpFinished(op_id=op_id, ok=False, error="model pool full"))
            return
        self.jobs += 1
        if mode == "batch":
            self.inflight = token
            self.gate.start()

    def done(self, msg: ExtractDone) -> bool:
        """Store the facts of a finished extraction and finish its records, or put a
        failed batch back (retried after the gate's backoff) / fail a single record (the
        outbox retries it). True when the turns were extracted. Raises OSError."""
        ops = msg.ops
        self.jobs = max(0, self.jobs - 1)
        forgotten = self.forgotten
        if not self.jobs:
            self.forgotten = set()
        if forgotten and any(t.text.strip() in forgotten for t in msg.turns()):
            # Some of these turns were forgotten while the model had them: whatever it
            # answered, the rest is extracted again without them.
            ops = [(op_id, [t for t in turns if t.text.strip() not in forgotten]) for op_id, turns in ops]
            self.ports.log.info("an extraction job had forgotten turns; its answer is dropped and the rest extracted again")
            if msg.mode == "batch":
                self.inflight = None
                mono = self.ports.clock.monotonic()
                if msg.error is not None:
                    self.gate.failed_at(mono)
                else:
                    self.gate.answered_at(mono)
                self.queue.put_back(ops, msg.trigger)
            else:
                for op_id, _ in ops:
                    # The outbox retries the record from its payload, scrubbed by the erasure.
                    self.ports.send(OUTBOX, OpFinished(op_id=op_id, ok=False, error="turns forgotten during extraction"))
            return False
        if msg.mode == "batch":
            self.inflight = None
            mono = self.ports.clock.monotonic()
            if msg.error is not None:
                delay = self.gate.failed_at(mono)
                self.queue.put_back(ops, msg.trigger)
                self.ports.log.warning("batch fact extraction failed (%d records kept); retried in %.0f s", len(ops), delay)
                return False
            self.gate.answered_at(mono)
        if msg.error is not None:
            self.ports.log.warning("fact extraction failed; the outbox will retry (%d records)", len(ops))
            for op_id, _ in ops:
                self.op_rows.pop(op_id, None)  # the outbox's retry brings them again
                self.ports.send(OUTBOX, OpFinished(op_id=op_id, ok=False, error=msg.error))
            return False
        now = self.ports.now()
        new = fl.normalize_extraction(msg.output, now=now, source="user_observation", settings=self.s)
        new = _with_turn_span(new, msg.turns())
        added, _skipped = self.store.add_facts(new)
        if msg.mode == "batch":
            self.queue.checked(now)
        mined = [rows for rows in (self.op_rows.pop(op_id, None) for op_id, _ in ops) if rows is not None]
        if mined:
            self.ports.send(RECENT, TurnsMined(ranges=mined))
        for op_id, _ in ops:
            self.op_done(op_id)
        if added and self.ports.powerful():
            self.ports.send(REFLECTIONS, NewFacts(facts=added))
        return True

    def wait(self, now: datetime) -> float | None:
        """Seconds until a batch extraction is due and its gate is open (0: now); None
        when nothing waits, one is in flight, or no model can run it."""
        if self.inflight is not None or not self.ports.model_available("extract_facts"):
            return None
        return self.queue.wait_seconds(now, max(0.0, self.gate.not_before - self.ports.clock.monotonic()))


def _row_range(payload: Mapping[str, object]) -> tuple[int, int] | None:
    """The journal rows ``(first, last)`` a post-turn record holds (``rows``, or
    ``backlog_rows`` for a batch of the fact backlog); None when it names none."""
    for key in ("rows", BACKLOG_ROWS_KEY):
        value = payload.get(key)
        if isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return (int(value[0]), int(value[1]))
    return None


def _with_turn_span(facts: list[Fact], turns: list[Turn]) -> list[Fact]:
    """Tag extracted facts with the time span of the turns they came from (the memory
    browser jumps from a fact to those turns in time_indexed.db)."""
    stamps = sorted(t.ts for t in turns if t.ts)
    if not stamps:
        return facts
    span = {"kind": "turns", "from": stamps[0], "to": stamps[-1]}
    return [f if f.source_ref is not None else msgspec.structs.replace(f, source_ref=span) for f in facts]
