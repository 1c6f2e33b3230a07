"""Reflection refinement pass: clusters of near-duplicate active reflections (per entity,
from their cached vectors) for the refine_cluster task, and the check that a cluster is
still the one the model was shown."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

from nekomem.config.longterm import LongTermSettings
from nekomem.domain import refine as rf
from nekomem.domain.records import Reflection
from nekomem.domain.reflections.lifecycle import active
from nekomem.domain.reflections.views import TERMINAL


def reflection_clusters(
    reflections: Iterable[Reflection], model: str, dim: int, now: datetime, settings: LongTermSettings
) -> list[dict[str, str]]:
    """The clusters to send, each as member id -> text (see :func:`nekomem.domain.refine.plan_clusters`)."""
    groups: dict[str, list[Reflection]] = {}
    texts: dict[str, str] = {}
    for ref in active(reflections):
        groups.setdefault(ref.entity, []).append(ref)
        texts[ref.id] = ref.text
    clusters = rf.plan_clusters(groups.values(), lambda r: rf.cached_vector(r, model, dim), now, settings)
    return [{i: texts[i] for i in ids} for ids in clusters]


def cluster_changed(members: Mapping[str, str], reflections: Mapping[str, Reflection]) -> bool:
    """True when a member is gone, terminal, promoted or reworded since the cluster was
    sent: the model's answer is then about texts that no longer exist."""
    for rid, text in members.items():
        ref = reflections.get(rid)
        if ref is None or ref.status in TERMINAL or ref.status == "promoted" or ref.text != text:
            return True
    return False
