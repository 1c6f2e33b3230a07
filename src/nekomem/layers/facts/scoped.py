"""The fact layer's part of subject scoping: facts written for one group/participant subject.

Scoped facts carry ``subject_kind`` / ``subject_id`` / ``scope`` (nekomem.domain.subjects)
and never feed the owner's private pipeline: they are stored absorbed and signal-processed,
so reflection synthesis and the Stage-2 evidence pass (which build private memory) skip
them. Exact duplicates are detected within the subject only (the hash is salted with the
subject), so a group may hold a fact the owner's private corpus also holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from nekomem.actors.messages import ExtractScoped, ModelResult
from nekomem.actors.ports import LayerPorts
from nekomem.domain import facts as fl
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Fact, record_get
from nekomem.domain.subjects import Subject
from nekomem.layers.facts.state import FactStore, fact_index_entry
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.wire.answers import ScopedCreated


class ScopedDone(ModelResult, frozen=True):
    """An ``extract_facts`` job over one subject's history finished; ``caller`` waits for
    the answer of the ExtractScoped that started it."""

    subject: Subject
    caller: Reply | None
    provenance: Mapping[str, str] | None = None


def _salt(subject: Subject) -> str:
    return f"{subject.key}|{subject.scope}|"


def _created(facts: list[Fact]) -> ScopedCreated:
    return ScopedCreated(created=len(facts), fact_ids=[f.id for f in facts])


class ScopedFacts:
    """Stores and extracts the facts of group/participant subjects in the fact store."""

    def __init__(self, ports: LayerPorts, store: FactStore) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = store

    def store_scoped(self, subject: Subject, items: Sequence[object], provenance: Mapping[str, str] | None = None) -> list[Fact]:
        """Normalise ``items`` (extract_facts shape), stamp the subject (and the speaker's
        ``provenance``, kept as the importer keeps reference fields), store the new ones;
        returns them. Raises OSError (nothing is stored then)."""
        stamp = {"source_ref": {"neko": dict(provenance)}} if provenance else {}
        now = self.ports.now()
        known = {f.hash for f in self.store.facts.values() if f.subject_kind is not None}
        new: list[Fact] = []
        for item in items:
            fact = fl.normalize_fact(item, now=now, source="user_observation", settings=self.s, hash_prefix=_salt(subject))
            if fact is None or fact.hash in known:
                continue
            known.add(fact.hash)
            new.append(msgspec.structs.replace(fact, absorbed=True, signal_processed=True, **subject.fields(), **stamp))
        if new:
            self.store.record_many([("fact.added", {"fact": msgspec.to_builtins(f)}) for f in new])
            facts = self.store.facts
            self.ports.index_upsert([fact_index_entry(facts[f.id], "fact") for f in new if f.id in facts])
            self.ports.log.info("stored %d scoped facts", len(new))
        return new

    def add(self, subject: Subject, items: Sequence[Mapping[str, object]], reply: Reply | None) -> None:
        """Store already-extracted facts and answer ``{"created", "fact_ids"}``."""
        created = self.store_scoped(subject, items)
        if reply is not None:
            reply.ok(_created(created))

    def extract(self, msg: ExtractScoped) -> None:
        """Send the subject's history to ``extract_facts`` (the speaker as the user).
        Raises ActorFailure 502 when no model can take it now."""
        names = self.ports.names()
        master = msg.speaker_label or msg.subject.key
        messages = prompts.extract_facts_messages(msg.turns, now=self.ports.now(), master_name=master, ai_name=names["ai_name"])
        subject, caller, provenance = msg.subject, msg.reply, msg.provenance
        token = self.ports.ask_model(
            "extract_facts",
            messages,
            lambda token, output, error: ScopedDone(
                token=token, output=output, error=error, subject=subject, caller=caller, provenance=provenance
            ),
            timeout=self.s.longterm_extract_timeout_seconds,
        )
        if token is None:
            raise ActorFailure("extraction_unavailable", "scoped fact extraction is not available now; retry later", 502)

    def done(self, msg: ScopedDone) -> None:
        """Store what the extraction found and answer the caller (502 when it failed).
        Raises OSError."""
        caller = msg.caller
        if msg.error is not None:
            self.ports.log.warning("scoped fact extraction failed")
            if caller is not None:
                caller.fail(ActorFailure("extraction_failed", "scoped fact extraction failed; retry later", 502))
            return
        output = msg.output
        items = output if isinstance(output, list) else record_get(output, "facts", None) or []
        created = self.store_scoped(msg.subject, list(items) if isinstance(items, (list, tuple)) else [], msg.provenance)
        if caller is not None:
            caller.ok(_created(created))
