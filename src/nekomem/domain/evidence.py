"""The evidence model of reflections and persona entries.

Reinforcement and disputation are stored separately, each with the time of its last signal,
and decay when read: ``value x 0.5 ** (age_days / half_life)`` (30 and 180 days by default).
The stored values are never decayed in place by a read; a signal first rebases the side it
touches to its decayed value at ``now``, adds the delta, and restarts that side's clock.
Protected persona entries have a score of +inf and are never changed by a signal.

Every function is pure: records in, new records out, time passed in as ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Literal, TypeVar

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import (
    EvidenceFields,
    Observation,
    PersonaEntry,
    Reflection,
    age_days,
    record_get,
    to_iso,
)
from nekomem.domain.subjects import is_private

E = TypeVar("E", bound=EvidenceFields)

Signal = Literal["reinforce", "negate", "ignore"]
#: Where a signal comes from; it decides the weight.
SignalSource = Literal["user_fact", "user_confirm", "user_rebut", "user_ignore", "user_keyword_rebut"]
Tier = Literal["promoted", "confirmed", "archive_candidate", "pending"]

_ALLOWED: dict[SignalSource, frozenset[str]] = {
    "user_fact": frozenset({"reinforce", "negate"}),
    "user_confirm": frozenset({"reinforce"}),
    "user_rebut": frozenset({"negate"}),
    "user_keyword_rebut": frozenset({"negate"}),
    "user_ignore": frozenset({"ignore"}),
}


class EvidenceSnapshot(msgspec.Struct, frozen=True):
    """Decayed view of an entry's evidence at one moment (for events, logs and ranking)."""

    reinforcement: float
    disputation: float
    score: float
    tier: Tier


def is_protected(entry: object) -> bool:
    """True for protected (character-card) persona entries."""
    return bool(getattr(entry, "protected", False))


def decayed(value: float, last_signal_at: str | None, now: datetime, half_life_days: float) -> float:
    """``value`` decayed from ``last_signal_at`` to ``now``; a missing or future time means no decay."""
    if value == 0.0:
        return 0.0
    age = age_days(last_signal_at, now)
    if age is None or age <= 0:
        return value
    return value * math.pow(0.5, age / half_life_days)


def effective_reinforcement(entry: EvidenceFields, now: datetime, settings: LongTermSettings) -> float:
    """Reinforcement decayed to ``now`` (half-life ``evidence_rein_half_life_days``)."""
    return decayed(entry.reinforcement, entry.rein_last_signal_at, now, settings.evidence_rein_half_life_days)


def effective_disputation(entry: EvidenceFields, now: datetime, settings: LongTermSettings) -> float:
    """Disputation decayed to ``now`` (half-life ``evidence_disp_half_life_days``)."""
    return decayed(entry.disputation, entry.disp_last_signal_at, now, settings.evidence_disp_half_life_days)


def net_score(entry: EvidenceFields, now: datetime, settings: LongTermSettings | None = None) -> float:
    """Effective reinforcement minus effective disputation; +inf for a protected entry."""
    if is_protected(entry):
        return math.inf
    settings = settings or LongTermSettings()
    return effective_reinforcement(entry, now, settings) - effective_disputation(entry, now, settings)


def derive_tier(score: float, settings: LongTermSettings) -> Tier:
    """promoted (>= promote threshold), confirmed (>= confirm), archive_candidate (<= archive), else pending."""
    if score >= settings.evidence_promote_threshold:
        return "promoted"
    if score >= settings.evidence_confirm_threshold:
        return "confirmed"
    if score <= settings.evidence_archive_threshold:
        return "archive_candidate"
    return "pending"


def snapshot(entry: EvidenceFields, now: datetime, settings: LongTermSettings) -> EvidenceSnapshot:
    """The decayed evidence of ``entry`` at ``now``."""
    if is_protected(entry):
        return EvidenceSnapshot(entry.reinforcement, entry.disputation, math.inf, "promoted")
    rein = effective_reinforcement(entry, now, settings)
    disp = effective_disputation(entry, now, settings)
    score = rein - disp
    return EvidenceSnapshot(rein, disp, score, derive_tier(score, settings))


def signal_delta(signal: Signal, source: SignalSource, settings: LongTermSettings) -> tuple[Literal["rein", "disp"], float]:
    """The side and base weight of a signal, before any combo bonus. Raises ValueError for a bad pair."""
    if signal not in _ALLOWED.get(source, frozenset()):
        raise ValueError(f"signal {signal!r} cannot come from source {source!r}")
    if source == "user_fact":
        if signal == "reinforce":
            return "rein", settings.evidence_user_fact_reinforce_delta
        return "disp", settings.evidence_user_fact_negate_delta
    if source == "user_confirm":
        return "rein", settings.evidence_user_confirm_delta
    if source == "user_rebut":
        return "disp", settings.evidence_user_rebut_delta
    if source == "user_keyword_rebut":
        return "disp", settings.evidence_user_keyword_rebut_delta
    return "rein", settings.evidence_ignored_delta


def apply_signal(entry: E, signal: Signal, source: SignalSource, now: datetime, settings: LongTermSettings) -> E:
    """Return ``entry`` with one evidence signal applied at ``now``.

    The touched side is rebased to its decayed value, the delta is added and its clock set to
    ``now``; the other side is unchanged. An inferred reinforcement (``user_fact``) first
    raises the lifetime ``user_fact_reinforce_count``; once it exceeds
    ``evidence_reinforce_combo_threshold`` the combo bonus is added (0.5, 0.5, then 1.0 each).
    Disputation never goes below 0. A protected entry is returned unchanged.
    Raises ValueError when ``signal`` cannot come from ``source``.
    """
    side, delta = signal_delta(signal, source, settings)
    if is_protected(entry):
        return entry
    stamp = to_iso(now)
    if side == "disp":
        value = max(0.0, effective_disputation(entry, now, settings) + delta)
        return msgspec.structs.replace(entry, disputation=value, disp_last_signal_at=stamp)
    count = entry.user_fact_reinforce_count
    if source == "user_fact":
        count += 1
        if count > settings.evidence_reinforce_combo_threshold:
            delta += settings.evidence_reinforce_combo_bonus
    value = effective_reinforcement(entry, now, settings) + delta
    return msgspec.structs.replace(entry, reinforcement=value, rein_last_signal_at=stamp, user_fact_reinforce_count=count)


def seed_reinforcement(max_importance: int, settings: LongTermSettings) -> float:
    """Initial reinforcement of a new reflection from its most important source fact (10/9/8/7 -> 0.8/0.6/0.4/0.2)."""
    if max_importance >= 10:
        return settings.evidence_seed_importance_10
    table = {
        9: settings.evidence_seed_importance_9,
        8: settings.evidence_seed_importance_8,
        7: settings.evidence_seed_importance_7,
    }
    return table.get(max_importance, 0.0)


def merge_evidence(target: E, other: EvidenceFields, now: datetime, settings: LongTermSettings) -> E:
    """Merge-on-promote: each side becomes max(target, other) decayed to ``now``, both clocks
    restart at ``now`` and ``sub_zero_days`` resets to 0. A protected target is unchanged."""
    if is_protected(target):
        return target
    stamp = to_iso(now)
    return msgspec.structs.replace(
        target,
        reinforcement=max(effective_reinforcement(target, now, settings), effective_reinforcement(other, now, settings)),
        disputation=max(effective_disputation(target, now, settings), effective_disputation(other, now, settings)),
        rein_last_signal_at=stamp,
        disp_last_signal_at=stamp,
        sub_zero_days=0,
        sub_zero_last_increment_date=None,
    )


def track_below_zero(entry: E, now: datetime, settings: LongTermSettings) -> E:
    """Archive-sweep day counting: if the score is below 0 and no increment happened on
    ``now``'s calendar date, add 1 to ``sub_zero_days`` and remember the date. The counter
    never goes down when the score recovers. Protected entries are unchanged."""
    if is_protected(entry):
        return entry
    today = now.date().isoformat()
    if entry.sub_zero_last_increment_date == today:
        return entry
    if net_score(entry, now, settings) >= 0:
        return entry
    return msgspec.structs.replace(entry, sub_zero_days=entry.sub_zero_days + 1, sub_zero_last_increment_date=today)


def archive_due(entry: EvidenceFields, settings: LongTermSettings) -> bool:
    """True when a non-protected entry has been below zero on ``evidence_archive_days`` distinct days."""
    return not is_protected(entry) and entry.sub_zero_days >= settings.evidence_archive_days


# --- Stage 2 observations and signal validation ----------------------------------------


class ResolvedSignal(msgspec.Struct, frozen=True):
    """A validated map_evidence signal (or a check_disputation target) bound to its record."""

    fact_id: str | None
    target_kind: Literal["reflection", "persona"]
    target_id: str
    entity: str
    signal: Literal["reinforce", "negate"]


def observation_pool(
    reflections: Iterable[Reflection],
    persona: Mapping[str, Iterable[PersonaEntry]],
    now: datetime,
    settings: LongTermSettings,
    *,
    ranked_ids: Sequence[str] | None = None,
    entities: Iterable[str] | None = None,
) -> list[Observation]:
    """The observations of a map_evidence / check_disputation prompt, at most
    ``evidence_map_max_observations``.

    Pool: confirmed and promoted reflections plus non-protected persona entries, dropping
    scores < 0, suppressed entries, empty texts and other statuses; ``entities`` limits it.
    Order: ``ranked_ids`` first (the recall layer's vector/rerank order, unknown ids
    ignored), then the rest by evidence score, highest first.
    """
    wanted = set(entities) if entities is not None else None
    pool: list[Observation] = []
    for ref in reflections:
        if ref.status not in ("confirmed", "promoted") or not is_private(ref):
            continue
        if ref.suppress or not ref.text.strip() or (wanted is not None and ref.entity not in wanted):
            continue
        score = net_score(ref, now, settings)
        if score < 0:
            continue
        pool.append(Observation(id=ref.id, kind="reflection", entity=ref.entity, text=ref.text, score=score))
    for entity, entries in persona.items():
        if wanted is not None and entity not in wanted:
            continue
        for entry in entries:
            # Group/participant memory never takes part in the owner's evidence pass.
            if entry.protected or entry.suppress or not entry.text.strip() or not is_private(entry):
                continue
            score = net_score(entry, now, settings)
            if score < 0:
                continue
            pool.append(Observation(id=entry.id, kind="persona", entity=entity, text=entry.text, score=score))
    pool.sort(key=lambda o: -o.score)
    if ranked_ids:
        position = {oid: i for i, oid in enumerate(ranked_ids)}
        pool.sort(key=lambda o: position.get(o.id, len(position)))
    return pool[: settings.evidence_map_max_observations]


def _match_observation(target_id: str, by_id: Mapping[str, Observation]) -> Observation | None:
    if target_id in by_id:
        return by_id[target_id]
    # The model sometimes writes a prefixed or shortened id; accept a unique suffix match.
    tail = target_id.rsplit(".", 1)[-1]
    if tail in by_id:
        return by_id[tail]
    matches = [o for oid, o in by_id.items() if tail and oid.endswith(tail)]
    return matches[0] if len(matches) == 1 else None


def resolve_signals(output: object, batch_fact_ids: Iterable[str], observations: Sequence[Observation]) -> list[ResolvedSignal]:
    """Validate a map_evidence output ``{"signals": [{fact_id, target_id, signal}]}``.

    Kept: ``signal`` reinforce/negate, ``fact_id`` in the batch (or absent), ``target_id``
    one of the prompt's observations (exact, else a unique suffix match). The target kind
    and entity come from the observation, never from the model. Duplicates are dropped.
    """
    by_id = {o.id: o for o in observations}
    batch = set(batch_fact_ids)
    seen: set[tuple[str | None, str, str]] = set()
    result: list[ResolvedSignal] = []
    for item in record_get(output, "signals", None) or []:
        signal = record_get(item, "signal")
        if signal in ("reinforces", "negates"):
            signal = signal[:-1]
        if signal not in ("reinforce", "negate"):
            continue
        fid = record_get(item, "fact_id")
        if fid is not None and fid not in batch:
            continue
        target = record_get(item, "target_id")
        if not isinstance(target, str):
            continue
        obs = _match_observation(target.strip(), by_id)
        if obs is None:
            continue
        key = (fid, obs.id, signal)
        if key in seen:
            continue
        seen.add(key)
        result.append(ResolvedSignal(fact_id=fid, target_kind=obs.kind, target_id=obs.id, entity=obs.entity, signal=signal))
    return result


def resolve_disputed(output: object, observations: Sequence[Observation]) -> list[ResolvedSignal]:
    """Validate a check_disputation output ``{"disputed": [{"reflection_id"}]}`` against the
    prompt's observations (reflections or persona entries); each valid target once."""
    by_id = {o.id: o for o in observations}
    result: list[ResolvedSignal] = []
    seen: set[str] = set()
    for item in record_get(output, "disputed", None) or []:
        target = record_get(item, "reflection_id") or record_get(item, "target_id")
        if not isinstance(target, str):
            continue
        obs = _match_observation(target.strip(), by_id)
        if obs is None or obs.id in seen:
            continue
        seen.add(obs.id)
        result.append(ResolvedSignal(fact_id=None, target_kind=obs.kind, target_id=obs.id, entity=obs.entity, signal="negate"))
    return result
