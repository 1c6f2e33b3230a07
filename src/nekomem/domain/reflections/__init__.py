"""Reflections: synthesis, lifecycle, promotion, feedback, disputation, surfacing,
mentions and the archive sweep, one module per pass.

Pure functions over :class:`~nekomem.domain.records.Reflection` lists; the ReflectionActor
owns reflections.json / surfaced.json and makes the LLM calls. ``now`` is always an
argument. Status changes go through :func:`~.lifecycle.transition`, a compare-and-swap on
the current status, so a late result never overwrites a newer state. This package
re-exports the public names of its modules.
"""

from __future__ import annotations

from nekomem.domain.reflections.disputation import (
    RebuttalBatch,
    apply_disputed,
    apply_rebuttals,
    apply_resolved_signals,
    contains_negative_keyword,
    disputation_context,
    rebuttal_batch,
    rebuttal_targets,
    rebuttal_window_start,
    scan_start,
)
from nekomem.domain.reflections.feedback import (
    FEEDBACK_VALUES,
    apply_feedback,
    awaiting_feedback,
    confirm_by_user,
    deny_by_user,
    ignore_by_user,
    interpret_feedback,
    record_feedback,
    user_feedback,
)
from nekomem.domain.reflections.lifecycle import (
    LEGACY_TIME_SCOPES,
    RELATION_TYPES,
    TIME_SCOPES,
    TransitionError,
    active,
    add_reflection,
    anchor_time,
    block_promotion,
    can_transition,
    confirm,
    deny,
    find,
    is_past_for_render,
    mark_merged,
    mark_promoted,
    replace_one,
    transition,
)
from nekomem.domain.reflections.mentions import (
    is_mentioned,
    is_suppressed,
    mention_keywords,
    record_mention,
    record_reply_mentions,
    refresh_suppression,
    refresh_suppressions,
    suppressed_reflections,
)
from nekomem.domain.reflections.promotion import (
    evidence_confirmations,
    promotable,
    reset_confirmed_at,
    time_driven_confirmations,
    time_driven_promotable,
)
from nekomem.domain.reflections.refinement import cluster_changed, reflection_clusters
from nekomem.domain.reflections.surfacing import followup_candidates, record_surfaced
from nekomem.domain.reflections.sweep import (
    ReflectionSweep,
    age_out_terminal,
    archive_sweep,
    with_shard_paths,
)
from nekomem.domain.reflections.synthesis import (
    SynthBackoff,
    SynthesisBatch,
    build_reflection,
    clear_synthesis_backoff,
    record_synthesis_failure,
    synthesis_allowed,
    synthesis_batch,
)
from nekomem.domain.reflections.views import (
    TERMINAL,
    EditError,
    edit_changes,
    index_entry,
    public_view,
)

__all__ = ["EditError", "FEEDBACK_VALUES", "LEGACY_TIME_SCOPES", "RELATION_TYPES", "RebuttalBatch", "ReflectionSweep", "SynthBackoff", "SynthesisBatch", "TERMINAL", "TIME_SCOPES", "TransitionError", "active", "add_reflection", "age_out_terminal", "anchor_time", "apply_disputed", "apply_feedback", "apply_rebuttals", "apply_resolved_signals", "archive_sweep", "awaiting_feedback", "block_promotion", "build_reflection", "can_transition", "clear_synthesis_backoff", "cluster_changed", "confirm", "confirm_by_user", "contains_negative_keyword", "deny", "deny_by_user", "disputation_context", "edit_changes", "evidence_confirmations", "find", "followup_candidates", "ignore_by_user", "index_entry", "interpret_feedback", "is_mentioned", "is_past_for_render", "is_suppressed", "mark_merged", "mark_promoted", "mention_keywords", "promotable", "public_view", "rebuttal_batch", "rebuttal_targets", "rebuttal_window_start", "record_feedback", "record_mention", "record_reply_mentions", "record_surfaced", "record_synthesis_failure", "reflection_clusters", "refresh_suppression", "refresh_suppressions", "replace_one", "reset_confirmed_at", "scan_start", "suppressed_reflections", "synthesis_allowed", "synthesis_batch", "time_driven_confirmations", "time_driven_promotable", "transition", "user_feedback", "with_shard_paths"]
