"""Long-term memory settings: facts, reflections, evidence, persona.

Defaults are the reference implementation's numbers (reference/neko-lifecycle.md §9 and the
numbers quoted in §2-§8). Out of scope and therefore absent: group/scoped subjects, external
imports, speaker trust, the anti-repeat corpus, ban-topic directives and the user-facing
hybrid recall (that lives in the recall section).
"""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc

_NEGATIVE_KEYWORDS: tuple[str, ...] = (
    # zh
    "别再说",
    "别说了",
    "别提了",
    "别提",
    "不想聊",
    "换个话题",
    "不要再说",
    "不是这样",
    "不对",
    # ja
    "その話はやめて",
    "もう言わないで",
    "話題を変えて",
    "その話はしないで",
    "違うよ",
    "そうじゃない",
    # en
    "stop talking about",
    "don't mention",
    "do not mention",
    "change the topic",
    "stop bringing up",
    "that's not true",
    "that is not true",
    "that's wrong",
    # ko
    "그만 말해",
    "얘기하지 마",
    "화제를 바꿔",
    # ru
    "хватит говорить",
    "не упоминай",
    "смени тему",
)

# The reference's CHARACTER_RESERVED_FIELDS (system fields kept by its own features, then
# the workshop import's), plus "avatar".
_CARD_RESERVED_FIELDS: tuple[str, ...] = (
    "_reserved",
    "character_id",
    "live2d",
    "voice_id",
    "system_prompt",
    "model_type",
    "live3d_sub_type",
    "vrm",
    "vrm_animation",
    "lighting",
    "vrm_rotation",
    "live2d_item_id",
    "live2d_idle_animation",
    "item_id",
    "idleAnimation",
    "idleAnimations",
    "mmd",
    "mmd_animation",
    "mmd_idle_animation",
    "mmd_idle_animations",
    "touch_set",
    "_field_order",
    "原始数据",
    "文件路径",
    "创意工坊物品ID",
    "description",
    "tags",
    "name",
    "描述",
    "标签",
    "关键词",
    "avatar",
)


class LongTermSettings(Section, frozen=True):
    powerful_memory_default: Annotated[bool, doc("Value of the powerful-memory switch when none has been persisted yet.")] = True

    # --- evidence: thresholds, decay, deltas -------------------------------------------
    evidence_confirm_threshold: Annotated[float, doc("Net evidence score at or above which a pending reflection becomes confirmed.")] = 1.0
    evidence_promote_threshold: Annotated[
        float, doc("Net evidence score at or above which a confirmed reflection is promotable to persona.")
    ] = 2.0
    evidence_archive_threshold: Annotated[
        float, doc("Net evidence score at or below which an entry is labelled an archive candidate (a label only).")
    ] = -2.0
    evidence_rein_half_life_days: Annotated[
        float, doc("Half-life of stored reinforcement, measured from rein_last_signal_at; decay is applied when read.", gt=0)
    ] = 30.0
    evidence_disp_half_life_days: Annotated[
        float, doc("Half-life of stored disputation, measured from disp_last_signal_at; decay is applied when read.", gt=0)
    ] = 180.0
    evidence_archive_days: Annotated[
        int, doc("Distinct calendar days with a score below zero after which a non-protected entry is archived.", ge=1)
    ] = 14
    evidence_archive_shard_max_entries: Annotated[
        int, doc("Most entries in one day-dated archive shard file (reflection_archive/, persona_archive/).", ge=1)
    ] = 500
    evidence_archive_sweep_interval_seconds: Annotated[float, doc("Interval of the below-zero day counting and archive sweep.", gt=0)] = (
        3600.0
    )
    evidence_archive_sweep_initial_delay_seconds: Annotated[float, doc("Delay before the first archive sweep after start-up.", ge=0)] = (
        250.0
    )
    evidence_user_confirm_delta: Annotated[
        float, doc("Reinforcement added when the user confirms a surfaced reflection (direct feedback).")
    ] = 1.0
    evidence_user_rebut_delta: Annotated[
        float, doc("Disputation added when the user denies a surfaced reflection (direct feedback).", ge=0)
    ] = 1.0
    evidence_user_keyword_rebut_delta: Annotated[
        float, doc("Disputation added to each target confirmed by the negative-keyword check.", ge=0)
    ] = 1.0
    evidence_ignored_delta: Annotated[
        float, doc("Reinforcement added (negative: removed) when the user ignores a surfaced reflection.")
    ] = -0.2
    evidence_user_fact_reinforce_delta: Annotated[
        float, doc("Reinforcement added by an inferred (Stage-2) 'reinforce' signal from a new user fact.")
    ] = 0.5
    evidence_user_fact_negate_delta: Annotated[
        float, doc("Disputation added by an inferred (Stage-2) 'negate' signal from a new user fact.", ge=0)
    ] = 1.0
    evidence_reinforce_combo_threshold: Annotated[
        int,
        doc(
            "Inferred reinforcements get the combo bonus once the lifetime counter (raised first) exceeds this; with 2 the third and later ones get it.",
            ge=0,
        ),
    ] = 2
    evidence_reinforce_combo_bonus: Annotated[
        float, doc("Extra reinforcement of an inferred reinforcement past the combo threshold (0.5 + 0.5 = 1.0).")
    ] = 0.5
    evidence_seed_importance_10: Annotated[
        float, doc("Initial reinforcement of a new reflection whose most important source fact has importance 10.", ge=0)
    ] = 0.8
    evidence_seed_importance_9: Annotated[
        float, doc("Initial reinforcement of a new reflection whose most important source fact has importance 9.", ge=0)
    ] = 0.6
    evidence_seed_importance_8: Annotated[
        float, doc("Initial reinforcement of a new reflection whose most important source fact has importance 8.", ge=0)
    ] = 0.4
    evidence_seed_importance_7: Annotated[
        float, doc("Initial reinforcement of a new reflection whose most important source fact has importance 7 (6 and below: 0).", ge=0)
    ] = 0.2
    evidence_promote_retry_backoff_minutes: Annotated[
        float, doc("Minimum time between two promotion attempts of one reflection.", ge=0)
    ] = 30.0
    evidence_promote_max_retries: Annotated[int, doc("Promotion attempts after which a reflection becomes promote_blocked.", ge=1)] = 5

    # --- Stage 2: evidence mapping and negative keywords --------------------------------
    evidence_signal_check_enabled: Annotated[bool, doc("Run Stage 2 (map new facts to evidence signals) when powerful memory is on.")] = (
        True
    )
    evidence_map_max_observations: Annotated[
        int, doc("Most observations (reflections and persona entries) in one map_evidence or check_disputation prompt.", ge=1)
    ] = 30
    evidence_map_max_new_facts: Annotated[
        int, doc("Most new facts in one Stage-2 batch (highest importance first, then oldest).", ge=1)
    ] = 20
    evidence_per_observation_max_tokens: Annotated[int, doc("Each observation text is cut to this many tokens in a prompt.", ge=8)] = 200
    evidence_observations_total_max_tokens: Annotated[int, doc("Token cap of the whole observations block of one prompt.", ge=100)] = 15000
    evidence_negative_keyword_context_items: Annotated[
        int, doc("Latest user messages sent to check_disputation after a negative keyword.", ge=1)
    ] = 3
    evidence_negative_keywords: Annotated[
        tuple[str, ...], doc("Phrases (matched case-insensitively as substrings of a user message) that start the negative-keyword check.")
    ] = _NEGATIVE_KEYWORDS

    # --- fact extraction (path A batch, path B self-disclosure) -------------------------
    fact_extract_every_n_turns: Annotated[
        int, doc("Batch extraction runs once this many user turns arrived since the last check.", ge=1)
    ] = 10
    fact_extract_interval_minutes: Annotated[
        float, doc("Batch extraction runs when this long has passed since the last check and at least one user turn arrived.", ge=0)
    ] = 5.0
    fact_extract_idle_seconds: Annotated[
        float, doc("Idle time (no conversation activity) that lets a first batch extraction run.", ge=0)
    ] = 10.0
    fact_extract_idle_requires_first_run: Annotated[
        bool,
        doc(
            "As in the reference, the idle rule only applies before the first batch of a character (and to the tail of a burst a count-triggered batch left behind); false applies it always."
        ),
    ] = True
    fact_extract_max_batch_user_turns: Annotated[
        int,
        doc(
            "Most user turns in one batch extraction (whole requests; one request with more is taken alone); a longer backlog is extracted in several calls.",
            ge=1,
        ),
    ] = 20
    fact_backlog_enabled: Annotated[
        bool,
        doc(
            "Turns stored while no model could extract facts are mined once one is configured (in bounded batches, one at a time); false leaves them unmined."
        ),
    ] = True
    fact_backlog_batch_rows: Annotated[int, doc("Most journal rows handed to one fact extraction of the backlog.", ge=1)] = 20
    fact_extract_cold_start_lookback_minutes: Annotated[float, doc("Window start of the first batch extraction: now minus this.", ge=0)] = (
        10.0
    )
    fact_self_disclosure_every_n_passes: Annotated[
        int, doc("An AI-self-disclosure pass runs after this many successful batch passes.", ge=1)
    ] = 3
    fact_self_disclosure_max_window_messages: Annotated[
        int, doc("Most journal rows read by one self-disclosure pass (oldest first).", ge=1)
    ] = 200
    fact_self_disclosure_known_pool_max: Annotated[
        int, doc("Most already-known facts shown to the self-disclosure prompt as a do-not-repeat list.", ge=0)
    ] = 30
    fact_self_disclosure_cold_start_lookback_minutes: Annotated[
        float, doc("Window start of the first self-disclosure pass: the last batch-processed message minus this.", ge=0)
    ] = 50.0
    fact_self_disclosure_idle_seconds: Annotated[
        float,
        doc(
            "Beyond the reference: a self-disclosure pass also runs once the conversation has been idle this long and turns path A processed wait uncovered, so the last turns of a conversation do not wait for further batches. Keep it below passivate_idle_seconds (an idle character is stopped; its uncovered turns then wait for its next conversation).",
            gt=0,
        ),
    ] = 300.0
    fact_importance_default: Annotated[
        int, doc("Importance given to an extracted fact whose importance is missing or unparsable.", ge=1, le=10)
    ] = 5

    # --- fact dedup and archive ---------------------------------------------------------
    fact_near_dup_jaccard_threshold: Annotated[
        float,
        doc(
            "Lexical near-duplicate check: a new fact whose token-set Jaccard similarity with an existing fact of the same entity reaches this is skipped.",
            ge=0,
            le=1,
        ),
    ] = 0.8
    fact_near_dup_max_candidates: Annotated[
        int, doc("Most stored facts compared in one lexical near-duplicate check (bounds the cost on huge stores).", ge=1)
    ] = 2000
    fact_dedup_cosine_threshold: Annotated[
        float,
        doc(
            "Cosine at or above which two facts become a paraphrase candidate pair for judge_duplicates. Model-specific, so the embedding model's profile.json sets it unless you do: use 0.8 (paraphrases score 0.67-0.91, unrelated facts rarely above 0.55), e5 0.95, use+e5 (mean cosine) 0.875; the reference's 0.85 was tuned for another model.",
            ge=-1,
            le=1,
        ),
    ] = 0.875
    fact_dedup_pairs_per_new: Annotated[int, doc("Most paraphrase candidate pairs queued per new fact (strongest first).", ge=1)] = 3
    fact_dedup_batch_limit: Annotated[int, doc("Most pairs sent in one judge_duplicates call.", ge=1)] = 20
    fact_dedup_max_attempts: Annotated[int, doc("Failed judgments of a pair before it is dropped (dead letter).", ge=1)] = 5
    fact_merge_importance_bonus: Annotated[
        int, doc("Importance added to the kept fact when a duplicate is merged into it (capped at 10).", ge=0)
    ] = 1
    fact_archive_age_days: Annotated[float, doc("Absorbed facts older than this move to facts_archive.json.", ge=0)] = 7.0
    fact_archive_cooldown_hours: Annotated[float, doc("The fact archive move runs at most once per this many hours.", ge=0)] = 24.0

    # --- reflections --------------------------------------------------------------------
    reflection_min_facts: Annotated[int, doc("Unabsorbed facts (of at least reflection_min_importance) needed for a synthesis.", ge=1)] = 5
    reflection_min_importance: Annotated[int, doc("Only facts of at least this importance feed reflections.", ge=1, le=10)] = 5
    reflection_synthesis_facts_max: Annotated[
        int, doc("Most facts in one synthesis batch (highest importance first, then oldest).", ge=1)
    ] = 20
    reflection_synthesis_interval_seconds: Annotated[
        float, doc("Interval of the reflection synthesis loop (runs whatever the powerful-memory switch).", gt=0)
    ] = 180.0
    reflection_synthesis_initial_delay_seconds: Annotated[float, doc("Delay before the first synthesis after start-up.", ge=0)] = 200.0
    reflection_text_max_tokens: Annotated[
        int, doc("A synthesized text longer than this keeps its text but loses its time scope (ontology check fails).", ge=1)
    ] = 150
    reflection_related_per_query_k: Annotated[int, doc("Related-context recall: nearest absorbed facts per unabsorbed fact.", ge=1)] = 3
    reflection_related_total_cap: Annotated[int, doc("Related-context recall: most related facts in one synthesis prompt.", ge=0)] = 20
    reflection_cooldown_minutes: Annotated[
        float, doc("A new or surfaced reflection is not offered as a followup topic again for this long.", ge=0)
    ] = 30.0
    reflection_surface_top_k: Annotated[int, doc("Most followup topics offered to proactive chat.", ge=1)] = 3
    reflection_followup_weighted: Annotated[
        bool, doc("Pick followup topics by weighted sampling (weight = max(score, 0) + base) instead of top score.")
    ] = True
    reflection_followup_weight_base: Annotated[float, doc("Base weight of followup sampling.", ge=0)] = 0.5
    reflection_followup_text_key_chars: Annotated[
        int, doc("Followup candidates whose normalised first this-many characters match are offered once.", ge=1)
    ] = 120
    reflection_state_past_days: Annotated[
        float,
        doc(
            "A confirmed 'state' reflection whose anchor (end, else start, else created) is older than this renders as a past memory.", ge=0
        ),
    ] = 7.0
    reflection_episode_past_days: Annotated[
        float, doc("A confirmed 'episode' reflection whose anchor is older than this renders as a past memory.", ge=0)
    ] = 3.0
    reflection_auto_confirm_days: Annotated[
        float, doc("Powerful memory off: a pending reflection this old (from created_at) is confirmed.", ge=0)
    ] = 7.0
    reflection_auto_promote_days: Annotated[
        float, doc("Powerful memory off: a confirmed reflection this long after confirmed_at is promoted.", ge=0)
    ] = 7.0
    reflection_auto_promote_interval_seconds: Annotated[float, doc("Interval of the auto-promote loop.", gt=0)] = 180.0
    reflection_auto_promote_initial_delay_seconds: Annotated[float, doc("Delay before the first auto-promote pass.", ge=0)] = 150.0
    reflection_terminal_archive_days: Annotated[
        float,
        doc("Promoted and denied reflections move to the archive shards this long after promoted_at / denied_at (else created_at).", ge=0),
    ] = 30.0
    reflection_rebuttal_interval_seconds: Annotated[
        float, doc("Interval of the periodic disputation scan of confirmed reflections.", gt=0)
    ] = 180.0
    reflection_rebuttal_initial_delay_seconds: Annotated[float, doc("Delay before the first disputation scan.", ge=0)] = 100.0
    reflection_rebuttal_lookback_hours: Annotated[float, doc("First disputation scan of a character looks back this far.", ge=0)] = 1.0
    reflection_rebuttal_max_rows: Annotated[int, doc("Most journal rows read by one disputation scan.", ge=1)] = 200
    reflection_rebuttal_max_messages: Annotated[
        int, doc("Most user messages per disputation scan (extended to the rest of a same-timestamp cluster).", ge=1)
    ] = 20

    # --- persona ------------------------------------------------------------------------
    persona_render_max_tokens: Annotated[int, doc("Token budget of non-protected persona entries in /new_dialog.", ge=0)] = 2000
    reflection_render_max_tokens: Annotated[
        int, doc("Token budget of pending, confirmed and past reflections together in /new_dialog.", ge=0)
    ] = 2000
    persona_render_protected_max_entries: Annotated[
        int, doc("Most protected (character card) entries rendered; they are outside the token budget.", ge=0)
    ] = 80
    persona_render_suppressed_max_entries: Annotated[
        int, doc("Most entries in the 'do not bring up on your own' list; outside the token budget.", ge=0)
    ] = 40
    persona_merge_pool_max_tokens: Annotated[int, doc("Token cap of the pool of existing entries shown to judge_promotion.", ge=100)] = 4000
    persona_correction_batch_limit: Annotated[int, doc("Most contradiction-queue items resolved in one maintenance pass.", ge=1)] = 10
    persona_correction_max_attempts: Annotated[
        int, doc("Failed resolutions of one contradiction-queue item before it is dropped.", ge=1)
    ] = 5
    persona_version_history_max: Annotated[int, doc("Most earlier versions kept in a persona entry's version_history.", ge=0)] = 5
    persona_contradiction_overlap_ratio: Annotated[
        float,
        doc(
            "A new persona text 'may contradict' an entry of its section when shared keywords / the smaller keyword set reach this.",
            ge=0,
            le=1,
        ),
    ] = 0.4
    persona_card_reserved_fields: Annotated[tuple[str, ...], doc("Character card fields never turned into protected persona entries.")] = (
        _CARD_RESERVED_FIELDS
    )
    persona_card_list_separator: Annotated[str, doc("Separator joining list values of a character card field.")] = "、"

    # --- mention suppression (persona entries and confirmed reflections) -----------------
    longterm_mention_limit: Annotated[
        int, doc("More mentions than this within the window suppress an entry ('do not bring up on your own').", ge=0)
    ] = 2
    longterm_mention_window_hours: Annotated[float, doc("Mentions older than this are forgotten.", gt=0)] = 5.0
    longterm_suppress_cooldown_hours: Annotated[
        float, doc("A suppression is lifted (and the mentions cleared) this long after it started.", gt=0)
    ] = 5.0

    # --- maintenance, liveness, refinement ----------------------------------------------
    longterm_idle_maintenance_interval_seconds: Annotated[
        float, doc("Interval of the idle maintenance loop (fact dedup judgments, corrections).", gt=0)
    ] = 40.0
    longterm_idle_maintenance_initial_delay_seconds: Annotated[float, doc("Delay before the first idle maintenance pass.", ge=0)] = 20.0
    longterm_task_backoff_base_seconds: Annotated[
        float,
        doc(
            "Backoff of a background model task (duplicate judgment, synthesis, correction, disputation scan) after its first failure in a row; it doubles with each further failure.",
            gt=0,
        ),
    ] = 60.0
    longterm_task_backoff_max_seconds: Annotated[
        float, doc("Longest backoff of a background model task after failures in a row.", gt=0)
    ] = 3600.0
    longterm_liveness_max_attempts: Annotated[
        int, doc("Failures on the same input after which a background step is dead-lettered or its cursor forced forward.", ge=1)
    ] = 5
    longterm_dead_letter_self_heal_seconds: Annotated[
        float, doc("A dead-lettered synthesis batch, refine cluster or recheck is probed again after this long.", ge=0)
    ] = 18000.0
    longterm_refine_cosine_threshold: Annotated[
        float,
        doc(
            "Refinement: neighbours at or above this cosine form a cluster. Model-specific, so the embedding model's profile.json sets it unless you do: use 0.82, e5 0.96, use+e5 (mean cosine) 0.89.",
            ge=-1,
            le=1,
        ),
    ] = 0.89
    longterm_refine_topk_per_entry: Annotated[int, doc("Refinement: neighbours considered per entry.", ge=1)] = 5
    longterm_refine_cluster_size_max: Annotated[int, doc("Refinement: most members in one cluster.", ge=2)] = 6
    longterm_refine_clusters_per_pass: Annotated[int, doc("Refinement: clusters rewritten per pass.", ge=1)] = 3
    longterm_refine_revisit_after_days: Annotated[float, doc("Refinement: an unchanged cluster is revisited after this long.", ge=0)] = 30.0
    longterm_refine_interval_seconds: Annotated[float, doc("Interval of the refinement loop.", gt=0)] = 1800.0
    longterm_refine_persona_initial_delay_seconds: Annotated[float, doc("Delay before the first persona refinement.", ge=0)] = 400.0
    longterm_refine_reflection_initial_delay_seconds: Annotated[float, doc("Delay before the first reflection refinement.", ge=0)] = 500.0
    longterm_refine_max_attempts: Annotated[int, doc("Failed refinements after which a member is excluded.", ge=1)] = 5

    # --- per-task LLM timeouts (reference §8) --------------------------------------------
    longterm_extract_timeout_seconds: Annotated[float, doc("Timeout of extract_facts and extract_self_disclosure.", gt=0, le=110)] = 60.0
    longterm_map_evidence_timeout_seconds: Annotated[float, doc("Timeout of map_evidence.", gt=0, le=110)] = 90.0
    longterm_disputation_timeout_seconds: Annotated[
        float, doc("Timeout of check_disputation (negative-keyword target check).", gt=0, le=110)
    ] = 60.0
    longterm_synthesis_timeout_seconds: Annotated[float, doc("Timeout of synthesize_reflection.", gt=0, le=110)] = 110.0
    longterm_feedback_timeout_seconds: Annotated[float, doc("Timeout of check_feedback on surfaced reflections.", gt=0, le=110)] = 60.0
    longterm_rebuttal_timeout_seconds: Annotated[
        float, doc("Timeout of check_feedback in the periodic disputation scan.", gt=0, le=110)
    ] = 90.0
    longterm_promotion_timeout_seconds: Annotated[float, doc("Timeout of judge_promotion.", gt=0, le=110)] = 90.0
    longterm_correction_timeout_seconds: Annotated[float, doc("Timeout of resolve_correction.", gt=0, le=110)] = 110.0
    longterm_dedup_timeout_seconds: Annotated[float, doc("Timeout of judge_duplicates.", gt=0, le=110)] = 60.0
    longterm_refine_timeout_seconds: Annotated[float, doc("Timeout of refine_cluster.", gt=0, le=110)] = 110.0
