"""The admission claims of ``POST /release_character/{name}`` (the reference's hold, claim
token and generation; read from its memory server's runtime and review modules).

N.E.K.O.'s main process renames or deletes a character folder in a transaction: it draws
a claim token, captures the character's *generation* (a counter of its own that changes
when a name is published again), and posts ``/release_character/{name}`` with
``hold_derived_task_admission``, ``derived_task_claim_token`` and
``derived_task_claim_generation``. While a claim with the hold is open, writes to that
name are refused (409 ``cancelled``) so nothing reopens or recreates the folder while it
is moved. The transaction ends with ``POST /reload``, whose ``release_derived_task_claims``
(``{name: [token, ...]}``) closes its claims and whose ``resume_derived_task_names`` /
``resume_derived_task_generations`` open a published name again: claims of another
generation are dropped, claims of the same generation (a concurrent transaction) stay.

A token once released is remembered (the newest :data:`REMEMBERED_TOKENS`): a release
arriving with it afterwards (the caller gave up and compensated meanwhile) is answered
409 ``cancelled`` and changes nothing. The state is the process's only, as in the
reference: a restart opens every name.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

REMEMBERED_TOKENS = 4096


class ReleaseClaims:
    """Open claims per character name: token → (hold, generation). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claims: dict[str, dict[str, tuple[bool, int | None]]] = {}
        self._released: OrderedDict[tuple[str, str], None] = OrderedDict()

    def claim(self, name: str, token: str, generation: int | None, hold: bool) -> bool:
        """Open (or widen) claim ``token`` on ``name``; False when that token was already
        released (the caller withdrew it), and nothing changes then."""
        with self._lock:
            key = (name, token)
            if key in self._released:
                self._released.move_to_end(key)
                return False
            claims = self._claims.setdefault(name, {})
            previous = claims.get(token)
            claims[token] = (bool((previous and previous[0]) or hold), previous[1] if previous else generation)
            return True

    def release(self, name: str, token: str) -> None:
        """Close claim ``token`` on ``name`` and remember the token as released."""
        with self._lock:
            self._released[(name, token)] = None
            self._released.move_to_end((name, token))
            while len(self._released) > REMEMBERED_TOKENS:
                self._released.popitem(last=False)
            claims = self._claims.get(name)
            if claims is not None:
                claims.pop(token, None)
                if not claims:
                    del self._claims[name]

    def resume(self, name: str, generation: int | None) -> None:
        """A published name opens again: claims of another generation (or every claim, when
        no generation is known) are dropped; those of ``generation`` stay."""
        with self._lock:
            claims = self._claims.get(name)
            if not claims:
                return
            for token, (_, claimed) in list(claims.items()):
                if generation is None or claimed != generation:
                    del claims[token]
            if not claims:
                del self._claims[name]

    def active(self, name: str, token: str) -> bool:
        """Whether claim ``token`` on ``name`` is still open."""
        with self._lock:
            return token in self._claims.get(name, {})

    def held(self, name: str) -> bool:
        """Whether an open claim on ``name`` holds its writes."""
        with self._lock:
            return any(hold for hold, _ in self._claims.get(name, {}).values())
