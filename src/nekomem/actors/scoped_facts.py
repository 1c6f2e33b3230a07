"""FactActor's part of subject scoping: facts written for one group/participant subject.

Scoped facts carry ``subject_kind`` / ``subject_id`` / ``scope`` (nekomem.domain.subjects)
and never feed the owner's private pipeline: they are stored absorbed and signal-processed,
so reflection synthesis and the Stage-2 evidence pass (which build private memory) skip
them. Exact duplicates are detected within the subject only (the hash is salted with the
subject), so a group may hold a fact the owner's private corpus also holds.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nekomem.actors.handlers import handles
from nekomem.actors.messages import AddScopedFacts, ExtractScoped, ModelDone
from nekomem.domain import facts as fl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain.records import Fact, record_get
from nekomem.domain.subjects import Subject
from nekomem.runtime.reply import ActorFailure


def _salt(subject: Subject) -> str:
    return f"{subject.key}|{subject.scope}|"


class ScopedFactsMixin:
    """Handlers mixed into FactActor (which provides facts, record_many, ask_model, ...)."""

    facts: dict[str, Fact]

    def store_scoped(self, subject: Subject, items: list[Any]) -> list[Fact]:
        """Normalise ``items`` (extract_facts shape), stamp the subject, store the new ones."""
        now = self.now()  # type: ignore[attr-defined]
        known = {f.hash for f in self.facts.values() if f.subject_kind is not None}
        new: list[Fact] = []
        for item in items:
            fact = fl.normalize_fact(item, now=now, source="user_observation", settings=self.s, hash_prefix=_salt(subject))  # type: ignore[attr-defined]
            if fact is None or fact.hash in known:
                continue
            known.add(fact.hash)
            new.append(msgspec.structs.replace(fact, absorbed=True, signal_processed=True, **subject.fields()))
        if new:
            self.record_many([("fact.added", {"fact": msgspec.to_builtins(f)}) for f in new])  # type: ignore[attr-defined]
            from nekomem.actors.fact_state import fact_index_entry

            self.index_upsert([fact_index_entry(self.facts[f.id], "fact") for f in new if f.id in self.facts])  # type: ignore[attr-defined]
            self.log.info("stored %d scoped facts", len(new))  # type: ignore[attr-defined]
        return new

    @handles(AddScopedFacts)
    def on_AddScopedFacts(self, msg: AddScopedFacts) -> None:
        created = self.store_scoped(msg.subject, msg.facts)
        msg.reply.ok({"created": len(created), "fact_ids": [f.id for f in created]})

    @handles(ExtractScoped)
    def on_ExtractScoped(self, msg: ExtractScoped) -> None:
        names = self.names()  # type: ignore[attr-defined]
        master = msg.speaker_label or msg.subject.key
        messages = prompts.extract_facts_messages(msg.turns, now=self.now(), master_name=master, ai_name=names["ai_name"])  # type: ignore[attr-defined]
        token = self.ask_model(  # type: ignore[attr-defined]
            "scoped",
            "extract_facts",
            messages,
            context={"subject": msg.subject, "reply": msg.reply},
            timeout=self.s.longterm_extract_timeout_seconds,  # type: ignore[attr-defined]
        )
        if token is None:
            raise ActorFailure("extraction_unavailable", "scoped fact extraction is not available now; retry later", 502)

    def done_scoped(self, msg: ModelDone) -> None:
        reply = msg.context["reply"]
        if msg.error is not None:
            self.log.warning("scoped fact extraction failed")  # type: ignore[attr-defined]
            reply.fail(ActorFailure("extraction_failed", "scoped fact extraction failed; retry later", 502))
            return
        output = msg.output
        items = output if isinstance(output, list) else record_get(output, "facts", None) or []
        created = self.store_scoped(msg.context["subject"], list(items) if isinstance(items, (list, tuple)) else [])
        reply.ok({"created": len(created), "fact_ids": [f.id for f in created]})
