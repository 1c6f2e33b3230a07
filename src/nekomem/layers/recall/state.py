"""What the parts of one character's recall share: its settings, the index (rebuilt at
every load), the owners that have fed it, the uncovered turns' corpus and the token
sequence of its model jobs.

:class:`RecallPart` is the small base of the parts (vectors, query path, maintenance
ranking): it names the shared state under the attributes their methods always used
(``self.index``, ``self.s``, ``self.turns``, ``self.fed``), so the methods read as they
did when they were one class.
"""

from __future__ import annotations

import numpy as np

from nekomem.actors.messages import IndexUpsert, RequestIndex, Vectors
from nekomem.actors.ports import LayerPorts
from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import tier_owners
from nekomem.layers.recall import persist
from nekomem.models.embeddings import EmbeddingService
from nekomem.recall.entry import display_tz
from nekomem.recall.index import RecallIndex, StoredVectors
from nekomem.recall.turn_keys import TurnKeys
from nekomem.recall.turn_leg import TurnCorpus


def as_vectors(result: object) -> Vectors | None:
    """A model job's result as the float32 rows of a vector message (None: no result)."""
    return None if result is None else np.asarray(result, dtype=np.float32)


class RecallState:
    """The state every part of one character's recall reads (see the module)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        # The uncovered journal turns, indexed (rebuilt when the journal or its coverage changed).
        self.turns: TurnCorpus | None = None
        # recall_turn_keys: the covered turns, indexed, and the facts by their source turns.
        self.keys: TurnCorpus | None = None
        self.turn_keys: TurnKeys | None = None
        # Owners send their complete index from their own start-up, concurrently with the
        # first request: a query that arrives before every owner has is held (bounded by
        # recall_index_wait_seconds), so a just-activated character never answers empty.
        self.fed: set[str] = set()
        self._seq = 0
        # The fact rows mirror the facts owner (its feed came, or a current segment was
        # loaded); only then is a segment written at close. ``persisted``: the segment
        # loaded, until the facts' feed takes over its rows; ``loaded_tie``: its tie.
        self.facts_fed = False
        self.facts_changed = False
        self.persisted: persist.Loaded | None = None
        self.loaded_tie: list[list[int] | None] | None = None
        self.segment_due = False
        self.waiting_feeds: list[IndexUpsert] = []
        # The facts owner was asked for its feed (RequestIndex(wake=True)) by this load.
        self.fact_feed_asked = False
        # The facts' cached vectors read from their block beside a loaded segment, until the
        # vector side takes them (layers/recall/persist.py); and whether this load removed
        # the block because the fact rows changed.
        self.stored_vectors: StoredVectors | None = None
        self.vector_block_dropped = False

    def reset_index(self) -> None:
        """A new, empty index and turn corpus, with the settings read again (at every load)."""
        s = self.ports.settings.recall
        self.s = s
        analyzer = persist.analyzer_for(self.ports.settings, self.ports.character)
        self.index = RecallIndex(s, display_tz(self.ports.settings.server.display_timezone), analyzer)
        self.turns = None

    def reset_segment(self) -> None:
        """No segment loaded yet; one is loaded by the first message that needs the facts
        (not at start: the start runs on an actor worker that the character's other actors,
        those /new_dialog asks, wait for)."""
        self.facts_fed = False
        self.facts_changed = False
        self.persisted = None
        self.loaded_tie = None
        self.segment_due = self.s.recall_index_persist
        self.waiting_feeds = []
        self.fact_feed_asked = False
        self.stored_vectors = None
        self.vector_block_dropped = False

    def request_fact_feed(self) -> None:
        """Ask the facts owner for its complete feed, once per load (an owner that has read
        its facts already sent it, and does nothing)."""
        if not self.fact_feed_asked:
            self.fact_feed_asked = True
            self.ports.send(tier_owners()["fact"], RequestIndex(wake=True))

    def fresh_index(self, keep: list[IndexEntry]) -> RecallIndex:
        """A new, empty index (same settings and analyzer) holding ``keep``."""
        index = RecallIndex(self.s, display_tz(self.ports.settings.server.display_timezone), self.index.analyzer)
        index.upsert(keep)
        return index

    def uses_vectors(self) -> bool:
        """True when recall has, or will have, a vector side (an enabled embedding service)."""
        emb = self.ports.embeddings
        return emb is not None and self.s.recall_legs != "bm25" and getattr(emb, "state", "") != "disabled"

    def reset_feed(self) -> None:
        """No owner has fed the new index yet; job tokens start again."""
        self.fed = set()

    def reset_tokens(self) -> None:
        self._seq = 0

    def next_token(self) -> int:
        self._seq += 1
        return self._seq

    def service(self) -> EmbeddingService | None:
        """The process embedding service when it is ready and recall uses vectors."""
        emb = self.ports.embeddings
        if emb is None or self.s.recall_legs == "bm25":
            return None
        return emb if getattr(emb, "is_ready", False) else None


class RecallPart:
    """A part of the recall layer over the shared :class:`RecallState`."""

    def __init__(self, state: RecallState) -> None:
        self.state = state
        self.ports = state.ports
        self.log = state.ports.log

    @property
    def s(self) -> RecallSettings:
        return self.state.s

    @property
    def index(self) -> RecallIndex:
        return self.state.index

    @property
    def turns(self) -> TurnCorpus | None:
        return self.state.turns

    @turns.setter
    def turns(self, corpus: TurnCorpus | None) -> None:
        self.state.turns = corpus

    @property
    def fed(self) -> set[str]:
        return self.state.fed
