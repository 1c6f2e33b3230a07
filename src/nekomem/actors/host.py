"""The actors layer as the runtime sees it: how to start a character, and whether one has
work left over from a crash. The runtime never imports this package; the app hands it
:data:`ACTORS`."""

from __future__ import annotations

from contextlib import ExitStack

from nekomem.actors.supervisor import CharacterSupervisor, child_classes
from nekomem.domain.layers import event_owners
from nekomem.domain.post_turn import POST_TURN_CURSOR
from nekomem.runtime.dispatch import ActorRef
from nekomem.runtime.services import Routes, Services
from nekomem.stores.applied import SharedJournal
from nekomem.stores.fact_backlog import backlog_remaining
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.outbox import Outbox
from nekomem.stores.timeindex import TimeIndex


class CharacterActors:
    def __init__(self) -> None:
        # Import every actor module now, at start-up: the first activation must not pay
        # for it on an actor worker while requests wait.
        child_classes()

    def start_supervisor(self, name: str, services: Services, routes: Routes) -> ActorRef[CharacterSupervisor]:
        """Post the start of ``name``'s supervisor (its files open on a dispatcher worker)."""
        return CharacterSupervisor.start(name, services, routes)

    def has_unfinished(self, paths: CharacterPaths, *, mine_backlog: bool = False, hold: ExitStack | None = None) -> bool:
        """Whether the character has outbox work pending, turns whose post-turn record may
        be missing (stored after the cursor), journaled events not yet in its views, or
        with ``mine_backlog`` (a model can extract facts and the backlog is on) turns
        stored before such a model (so it must be activated at start-up to finish them).
        ``hold``: the journal's read connection stays open until it closes (see
        :meth:`TimeIndex.rows_after_cursor`); close it once the activation has loaded."""
        if paths.outbox.exists() and Outbox(paths.outbox).pending():
            return True
        if mine_backlog and backlog_remaining(paths.time_index_db):
            return True
        if TimeIndex.rows_after_cursor(paths.time_index_db, POST_TURN_CURSOR, hold=hold):
            return True
        if paths.events.exists():
            return SharedJournal(paths.events, paths.events_applied, event_owners()).has_unapplied()
        return False


ACTORS = CharacterActors()
