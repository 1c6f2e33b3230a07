"""The LLM task contract (SPEC §6.1): one output shape and one tier per task.

Each task's assistant content is a JSON object whose shape is the task's output Struct.
Unknown fields are ignored; a missing required field, a wrong type, an enum value outside
the contract or an importance outside 1..10 makes the output invalid. Fields that the
contract allows to be null default to null when absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec

from nekomem.models.jsonparse import ModelOutputError

__all__ = [
    "TASKS",
    "TaskSpec",
    "UnknownTaskError",
    "validate_output",
    "task_spec",
    "SummarizeRecentOutput",
    "DialogueTurn",
    "ReviewRecentOutput",
    "ExtractedFact",
    "ExtractFactsOutput",
    "EvidenceSignal",
    "MapEvidenceOutput",
    "DuplicateDecision",
    "JudgeDuplicatesOutput",
    "ReflectionDraft",
    "SynthesizeReflectionOutput",
    "FeedbackItem",
    "CheckFeedbackOutput",
    "DisputedItem",
    "CheckDisputationOutput",
    "JudgePromotionOutput",
    "ResolveCorrectionOutput",
    "RerankOutput",
    "RefineAction",
    "RefineClusterOutput",
]

_QUOTED_ENUM_VALUE = re.compile(r"^Invalid enum value .*?(?=( - at `[^`]*`)?$)", re.DOTALL)

Importance = Annotated[int, msgspec.Meta(ge=1, le=10, description="1 (trivial) .. 10 (core)")]
Entity = Literal["master", "neko", "relationship"]


class _Output(msgspec.Struct, kw_only=True, frozen=True):
    """Base of every task output (unknown fields are ignored by msgspec's default)."""


# --- summary / correction of the recent window -------------------------------------------


class SummarizeRecentOutput(_Output, frozen=True):
    summary: str


class DialogueTurn(_Output, frozen=True):
    role: str
    content: str


class ReviewRecentOutput(_Output, frozen=True):
    explanation: str
    corrected_dialogue: list[DialogueTurn]


# --- facts ----------------------------------------------------------------------------------


class ExtractedFact(_Output, frozen=True):
    text: str
    importance: Importance
    entity: Entity
    event_start_at: str | None = None
    event_end_at: str | None = None


class ExtractFactsOutput(_Output, frozen=True):
    facts: list[ExtractedFact]


class EvidenceSignal(_Output, frozen=True):
    fact_id: str
    target_id: str
    signal: Literal["reinforce", "negate"]


class MapEvidenceOutput(_Output, frozen=True):
    signals: list[EvidenceSignal]


class DuplicateDecision(_Output, frozen=True):
    new_id: str
    existing_id: str
    action: Literal["merge", "replace", "keep_both"]
    text: str | None = None


class JudgeDuplicatesOutput(_Output, frozen=True):
    decisions: list[DuplicateDecision]


# --- reflections ---------------------------------------------------------------------------


class ReflectionDraft(_Output, frozen=True):
    text: str
    entity: str
    time_scope: Literal["pattern", "state", "episode"]
    event_start_at: str | None = None
    event_end_at: str | None = None


class SynthesizeReflectionOutput(_Output, frozen=True):
    # Required even though it may be null: `{}` is not an answer, `{"reflection": null}` is.
    reflection: ReflectionDraft | None


class FeedbackItem(_Output, frozen=True):
    reflection_id: str
    feedback: Literal["confirmed", "denied", "ignored"]


class CheckFeedbackOutput(_Output, frozen=True):
    feedback: list[FeedbackItem]


class DisputedItem(_Output, frozen=True):
    reflection_id: str


class CheckDisputationOutput(_Output, frozen=True):
    disputed: list[DisputedItem]


# --- persona -------------------------------------------------------------------------------


class JudgePromotionOutput(_Output, frozen=True):
    action: Literal["promote", "merge", "reject", "contradiction"]
    target_id: str | None = None
    text: str | None = None
    reason: str | None = None


class ResolveCorrectionOutput(_Output, frozen=True):
    action: Literal["keep_old", "replace", "merge"]
    text: str | None = None


# --- recall and maintenance ----------------------------------------------------------------


class RerankOutput(_Output, frozen=True):
    ids: list[str]


class RefineAction(_Output, frozen=True):
    op: Literal["keep", "modify", "merge", "split", "discard"]
    ids: list[str]
    texts: list[str] = msgspec.field(default_factory=list)


class RefineClusterOutput(_Output, frozen=True):
    actions: list[RefineAction]


# --- registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """One task of the contract: its name, tier, output Struct and response JSON schema.

    ``keeps_complete_items``: an answer cut off at its token limit may be used without its
    unfinished last list item (each item stands alone).
    """

    name: str
    tier: str
    output_type: type[msgspec.Struct]
    schema: dict[str, Any]
    keeps_complete_items: bool = True


class UnknownTaskError(KeyError):
    """The task name is not part of the contract."""


def _inline_schema(output_type: type[msgspec.Struct]) -> dict[str, Any]:
    """The JSON schema of ``output_type`` with the top-level object inlined.

    msgspec puts every Struct under ``$defs`` and answers a bare ``$ref``; OpenAI-style
    ``response_format`` wants the root to be the object itself.
    """
    raw = msgspec.json.schema(output_type)
    defs: dict[str, Any] = dict(raw.get("$defs", {}))
    ref = raw.get("$ref", "")
    root_name = ref.rsplit("/", 1)[-1]
    if root_name not in defs:
        return raw
    root = dict(defs.pop(root_name))
    if defs:
        root["$defs"] = defs
    return root


_TABLE: tuple[tuple[str, str, type[msgspec.Struct]], ...] = (
    ("summarize_recent", "summary", SummarizeRecentOutput),
    ("review_recent", "correction", ReviewRecentOutput),
    ("extract_facts", "summary", ExtractFactsOutput),
    ("extract_self_disclosure", "summary", ExtractFactsOutput),
    ("map_evidence", "summary", MapEvidenceOutput),
    ("judge_duplicates", "summary", JudgeDuplicatesOutput),
    ("synthesize_reflection", "summary", SynthesizeReflectionOutput),
    ("check_feedback", "summary", CheckFeedbackOutput),
    ("check_disputation", "emotion", CheckDisputationOutput),
    ("judge_promotion", "correction", JudgePromotionOutput),
    ("resolve_correction", "correction", ResolveCorrectionOutput),
    ("rerank", "summary", RerankOutput),
    ("refine_cluster", "correction", RefineClusterOutput),
)

# review_recent's corrected dialogue is spliced into the window aligned at its end: the
# first turns of a cut-off answer would land in the wrong slots, so it is all or nothing.
_WHOLE_ANSWER_ONLY = frozenset({"review_recent"})

TASKS: dict[str, TaskSpec] = {
    name: TaskSpec(
        name=name,
        tier=tier,
        output_type=output,
        schema=_inline_schema(output),
        keeps_complete_items=name not in _WHOLE_ANSWER_ONLY,
    )
    for name, tier, output in _TABLE
}


def task_spec(task: str) -> TaskSpec:
    """The spec of ``task``; raises UnknownTaskError for a name outside the contract."""
    try:
        return TASKS[task]
    except KeyError:
        raise UnknownTaskError(f"unknown LLM task {task!r}") from None


def validate_output(task: str, obj: dict[str, Any]) -> msgspec.Struct:
    """Convert a parsed JSON object into the task's output Struct.

    Numbers sent as numeric strings (``"7"``) are accepted; anything else of the wrong type,
    a missing required field or a value outside the contract raises ModelOutputError naming
    the offending path (never the value). Raises UnknownTaskError for an unknown task.
    """
    spec = task_spec(task)
    if not isinstance(obj, dict):
        raise ModelOutputError(f"{task}: expected a JSON object, got {type(obj).__name__}")
    try:
        return msgspec.convert(obj, spec.output_type, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec quotes a bad enum value; the value is model output, so drop it.
        problem = _QUOTED_ENUM_VALUE.sub("Invalid enum value", str(exc))
        raise ModelOutputError(f"{task}: invalid output: {problem}") from None
