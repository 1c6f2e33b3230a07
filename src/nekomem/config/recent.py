"""Recent-window settings (compression, hard cap, review)."""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc


class RecentSettings(Section, frozen=True):
    recent_compress_threshold_items: Annotated[int, doc("Compression runs when the window holds more than this many items.", ge=2)] = 20
    recent_history_max_items: Annotated[
        int, doc("After compression the window is one memo plus the newest (this - 1) raw items.", ge=2)
    ] = 10
    recent_summary_max_tokens: Annotated[int, doc("A summary longer than this is compressed once more.", ge=10)] = 1000
    recent_per_message_max_tokens: Annotated[
        int, doc("Each message is head/tail truncated to this many tokens in the summariser input.", ge=10)
    ] = 500
    recent_compress_input_budget_tokens: Annotated[int, doc("Summariser input above this goes through a budgeted map-reduce.", ge=100)] = (
        8000
    )
    recent_map_reduce_max_depth: Annotated[int, doc("Most reduce rounds of the map-reduce.", ge=1)] = 3
    recent_compress_max_rounds: Annotated[int, doc("Most stage-1/stage-2 rounds of one compression.", ge=1)] = 3
    recent_hard_cap_tokens: Annotated[int, doc("The window never holds more tokens than this, whatever the summariser does.", ge=100)] = (
        60_000
    )
    recent_hard_cap_min_items: Annotated[int, doc("The hard cap keeps at least this many newest items while they fit.", ge=1)] = 10
    recent_idle_compress_seconds: Annotated[
        float,
        doc("A window over the threshold is compressed (by a timer of the recent actor) once the character has been idle this long.", ge=0),
    ] = 10.0
    recent_compress_retry_seconds: Annotated[
        float, doc("First wait before an idle retry after a failed compression; doubles per failure.", ge=0)
    ] = 30.0
    recent_compress_retry_max_seconds: Annotated[float, doc("Longest wait between idle compression retries.", ge=0)] = 1800.0
    recent_summary_stale_hours: Annotated[
        float, doc("Hours since the last summary after which the summariser is told to move stale content to an 'earlier' block.", ge=0)
    ] = 1.0
    recent_tokenizer_encoding: Annotated[
        str, doc("tiktoken encoding for every token count (o200k_base or cl100k_base, both shipped offline).")
    ] = "o200k_base"
    recent_memo_prefix: Annotated[str, doc("Text before the summary in the memo message.")] = "Memo from prior conversations: "
    recent_truncation_marker: Annotated[str, doc("Text put between the head and the tail of a message cut to fit a token limit.")] = (
        "…[middle omitted]…"
    )
    recent_stage2_target_words: Annotated[
        int, doc("Stage-2 asks the summariser to compress an over-long summary to about this many words (characters for CJK).", ge=10)
    ] = 700
    recent_sentence_final_marks: Annotated[
        str, doc("Characters that end a sentence; a stage-2 summary is cut back to the last of them.")
    ] = ".!?。！？…\n"
    recent_hard_cap_memo_share: Annotated[
        float,
        doc(
            "When the head memo and the newest item do not fit the hard cap together, the memo keeps at most this share of the cap (at most 0.9, so the newest item always keeps room).",
            ge=0,
            le=0.9,
        ),
    ] = 0.5
    master_name: Annotated[str, doc("How the user is named in prompts and rendered history.")] = "Master"
    review_enabled: Annotated[
        bool, doc("Default of the recent-memory review switch (recent_memory_auto_review); the persisted switch wins.")
    ] = True
    review_skip_history_len: Annotated[int, doc("The review runs only when the window has at least this many items.", ge=1)] = 8
    review_min_interval_seconds: Annotated[float, doc("Minimum time between two reviews of one character.", ge=0)] = 60.0
    review_min_new_messages: Annotated[int, doc("New user messages since the last reviewed tail needed for a review.", ge=1)] = 5
    review_long_idle_bypass_seconds: Annotated[float, doc("After this much idle time one new message is enough for a review.", ge=0)] = (
        1800.0
    )
    review_output_exhaustion_max_attempts: Annotated[
        int, doc("Reviews that ran out of output tokens before the review is blocked until the context shrinks.", ge=1)
    ] = 3
    review_max_fail_attempts: Annotated[int, doc("Failed reviews of the same tail before it is dead-lettered.", ge=1)] = 5
    review_fingerprint_k: Annotated[int, doc("Messages in the tail fingerprint used to splice a review result.", ge=1)] = 3
    review_fingerprint_prefix_chars: Annotated[
        int, doc("Characters of a message's text stored in a tail-fingerprint entry (next to its sha256).", ge=1)
    ] = 50
    gap_notice_seconds: Annotated[float, doc("/new_dialog adds a gap notice when the last turn is at least this old.", ge=0)] = 1800.0
    gap_long_seconds: Annotated[
        float, doc("/new_dialog adds the current time and a stronger hint when the last turn is at least this old.", ge=0)
    ] = 18000.0
    theater_episodes_per_story: Annotated[
        int, doc("Theater capsules kept in the recent window per story (its newest sessions by run number).", ge=1)
    ] = 3
    theater_episodes_total: Annotated[int, doc("Theater capsules kept in the recent window over all stories.", ge=1)] = 30
    theater_tombstone_ttl_seconds: Annotated[
        float, doc("How long a theater retraction or story forget keeps dropping late archive writes.", ge=0)
    ] = 7 * 24 * 3600.0
    theater_tombstones_max: Annotated[int, doc("Most theater retraction (and, separately, forget) tombstones kept.", ge=1)] = 128
    repetition_min_messages: Annotated[
        int, doc("repetition_insights reports a phrase found in at least this many of the analysed replies.", ge=2)
    ] = 3
    repetition_max_candidates: Annotated[int, doc("Most phrases repetition_insights returns (the strongest first).", ge=1)] = 50
    repetition_scan_rows: Annotated[
        int, doc("Most journal rows repetition_insights reads back from the newest while collecting replies.", ge=1)
    ] = 5000
