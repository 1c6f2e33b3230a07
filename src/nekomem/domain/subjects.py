"""Subject scoping of long-term memory (group chats and their participants).

A fact, reflection or persona entry may carry ``subject_kind`` / ``subject_id`` /
``scope`` (the reference's field names). An entry with none of the three belongs to the
owner's private corpus ("legacy_private"); an entry with all three belongs to exactly that
subject; an entry with only some of them is malformed and is served to nobody.

Reads fail closed:

- no subjects (``None``): only the private corpus;
- one or more subjects: only entries of exactly those subjects (same key and scope), never
  a private one;
- an explicit empty list is a caller bug and is refused (:class:`SubjectError`), never
  read as "no filter".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

LEGACY_PRIVATE_SCOPE = "legacy_private"
SCOPED_PERSONA_PREFIX = "@subject/"
SUBJECT_KINDS: frozenset[str] = frozenset({"group_chat", "participant", "group_participant"})
SUBJECT_FIELDS = ("subject_kind", "subject_id", "scope")
MAX_SUBJECTS = 8
MAX_COMPONENT_CHARS = 256


class SubjectError(ValueError):
    """A subject descriptor from a request is malformed (the message says which part)."""


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """One memory owner and its isolation boundary."""

    subject_kind: str
    subject_id: str
    scope: str

    @property
    def key(self) -> str:
        return f"{self.subject_kind}:{self.subject_id}"

    @property
    def marker(self) -> tuple[str, str]:
        """What two subjects must share to see each other's entries."""
        return (self.key, self.scope)

    @property
    def persona_section(self) -> str:
        return f"{SCOPED_PERSONA_PREFIX}{self.key}"

    def fields(self) -> dict[str, str]:
        return {"subject_kind": self.subject_kind, "subject_id": self.subject_id, "scope": self.scope}


def _component(raw: Any, field: str) -> str:
    if not isinstance(raw, str):
        raise SubjectError(f"{field} must be a string")
    value = raw.strip()
    if not value:
        raise SubjectError(f"{field} must not be empty")
    if len(value) > MAX_COMPONENT_CHARS:
        raise SubjectError(f"{field} has more than {MAX_COMPONENT_CHARS} characters")
    if any(ord(ch) < 0x20 for ch in value):
        raise SubjectError(f"{field} contains control characters")
    return value


def make_subject(kind: Any, subject_id: Any, scope: Any = None) -> Subject:
    """A validated subject; ``scope`` defaults to ``"<kind>:<id>"``. Raises SubjectError."""
    clean_kind = _component(kind, "subject_kind")
    if clean_kind not in SUBJECT_KINDS:
        raise SubjectError(f"subject_kind must be one of {', '.join(sorted(SUBJECT_KINDS))}")
    clean_id = _component(subject_id, "subject_id")
    clean_scope = f"{clean_kind}:{clean_id}" if scope is None else _component(scope, "scope")
    if clean_scope == LEGACY_PRIVATE_SCOPE:
        raise SubjectError("a subject cannot use the legacy_private scope")
    return Subject(subject_kind=clean_kind, subject_id=clean_id, scope=clean_scope)


def subject_from_request(raw: Any) -> Subject:
    """One request subject ``{subject_kind, subject_id, scope?}``. Raises SubjectError."""
    if not isinstance(raw, Mapping):
        raise SubjectError("a subject must be an object {subject_kind, subject_id, scope?}")
    return make_subject(raw.get("subject_kind", raw.get("kind")), raw.get("subject_id"), raw.get("scope"))


def subjects_from_request(raw: Any) -> list[Subject] | None:
    """The ``subjects`` field of a read: None (absent: private corpus) or 1..8 distinct
    subjects. An empty list, more than 8 items or a malformed item raise SubjectError."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_SUBJECTS:
        raise SubjectError(f"subjects must be omitted (legacy private) or contain 1..{MAX_SUBJECTS} items")
    out: list[Subject] = []
    for item in raw:
        subject = subject_from_request(item)
        if subject.marker not in {s.marker for s in out}:
            out.append(subject)
    return out


def _get(entry: Any, field: str) -> Any:
    if isinstance(entry, Mapping):
        return entry.get(field)
    return getattr(entry, field, None)


def is_private(entry: Any) -> bool:
    """True for an entry of the owner's private corpus (none of the three fields set)."""
    return all(_get(entry, f) is None for f in SUBJECT_FIELDS)


def entry_subject(entry: Any) -> Subject | None:
    """The entry's subject, or None when it is private or its descriptor is malformed."""
    values = [_get(entry, f) for f in SUBJECT_FIELDS]
    if any(v is None for v in values):
        return None
    try:
        return make_subject(*values)
    except SubjectError:
        return None


def same_corpus(a: Any, b: Any) -> bool:
    """True when two entries belong to the same corpus (both private, or the same subject)."""
    if is_private(a) or is_private(b):
        return is_private(a) and is_private(b)
    sa, sb = entry_subject(a), entry_subject(b)
    return sa is not None and sb is not None and sa.marker == sb.marker


def effective_scope(entry: Any) -> str:
    subject = entry_subject(entry)
    return subject.scope if subject is not None else LEGACY_PRIVATE_SCOPE


def visible(entry: Any, subjects: Sequence[Subject] | None) -> bool:
    """Whether a read for ``subjects`` (None: the private corpus) may see ``entry``."""
    if subjects is None:
        return is_private(entry)
    subject = entry_subject(entry)
    return subject is not None and subject.marker in {s.marker for s in subjects}


def filter_visible(entries: Iterable[Any], subjects: Sequence[Subject] | None) -> list[Any]:
    """The entries a read for ``subjects`` may see, in their order (filter before ranking)."""
    markers = None if subjects is None else {s.marker for s in subjects}
    out = []
    for entry in entries:
        if markers is None:
            if is_private(entry):
                out.append(entry)
            continue
        subject = entry_subject(entry)
        if subject is not None and subject.marker in markers:
            out.append(entry)
    return out


def row_fields(entry: Any) -> dict[str, Any]:
    """``subject_kind`` / ``subject_id`` / ``scope`` of a result row (scope defaults to
    ``legacy_private``, as the reference's rows do)."""
    return {
        "subject_kind": _get(entry, "subject_kind"),
        "subject_id": _get(entry, "subject_id"),
        "scope": _get(entry, "scope") or LEGACY_PRIVATE_SCOPE,
    }


def is_scoped_section(section: str) -> bool:
    return section.startswith(SCOPED_PERSONA_PREFIX)


def private_persona(persona: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    """The persona as the private context sees it: scoped sections and scoped entries out."""
    return {section: [e for e in entries if is_private(e)] for section, entries in persona.items() if not is_scoped_section(section)}


def scoped_persona(persona: Mapping[str, Sequence[Any]], subjects: Sequence[Subject]) -> dict[str, list[Any]]:
    """Per subject section, the persona entries ``subjects`` may see (file order)."""
    out: dict[str, list[Any]] = {}
    for subject in subjects:
        rows = [e for entries in persona.values() for e in entries if visible(e, [subject])]
        if rows:
            out[subject.persona_section] = rows
    return out


class SubjectIndex:
    """Which indexed ids are not private (scoped or malformed), by subject marker.

    Lets recall answer the common private query without a scan: when nothing scoped is
    indexed, the private corpus is everything.
    """

    def __init__(self) -> None:
        self._private: set[str] = set()
        self._not_private: set[str] = set()
        self._by_marker: dict[tuple[str, str], set[str]] = {}
        self._marker_of: dict[str, tuple[str, str]] = {}

    def put(self, doc_id: str, entry: Any) -> None:
        self.remove(doc_id)
        if is_private(entry):
            self._private.add(doc_id)
            return
        self._not_private.add(doc_id)
        subject = entry_subject(entry)
        if subject is not None:
            self._by_marker.setdefault(subject.marker, set()).add(doc_id)
            self._marker_of[doc_id] = subject.marker

    def put_private(self, doc_ids: Iterable[str]) -> None:
        """Add ``doc_ids``, none indexed yet, as private entries (a persisted segment's
        rows: their privacy is known without their entries)."""
        self._private.update(doc_ids)

    def is_private_id(self, doc_id: str) -> bool:
        """True when ``doc_id`` is indexed as a private entry."""
        return doc_id in self._private

    def remove(self, doc_id: str) -> None:
        self._private.discard(doc_id)
        self._not_private.discard(doc_id)
        marker = self._marker_of.pop(doc_id, None)
        if marker is not None:
            ids = self._by_marker.get(marker)
            if ids is not None:
                ids.discard(doc_id)
                if not ids:
                    del self._by_marker[marker]

    def allowed(self, subjects: Sequence[Subject] | None) -> set[str] | None:
        """The ids a read may see; None means "every id" (a private read, nothing scoped).
        The set returned is the index's own: callers must not change it."""
        if subjects is None:
            return self._private if self._not_private else None
        out: set[str] = set()
        for subject in subjects:
            out |= self._by_marker.get(subject.marker, set())
        return out


def restrict(allowed: set[str] | None, visible_ids: set[str] | None) -> set[str] | None:
    """The intersection of two optional id filters (None: no filter). May return one of
    its arguments: the result is read, never changed."""
    if visible_ids is None:
        return allowed
    if allowed is None:
        return visible_ids
    return allowed & visible_ids
