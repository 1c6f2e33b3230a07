"""Recall and embedding settings."""

from __future__ import annotations

from typing import Annotated

import msgspec

from nekomem.config.base import Section, doc
from nekomem.config.endpoint import Endpoint

RECALL_LEGS = ("both", "bm25", "vector")
RECALL_RENDER_LANGUAGES = ("en", "ja", "zh")


class RecallSettings(Section, frozen=True):
    # Tokenizer (lexical leg).
    recall_cjk_ngram_min: Annotated[
        int, doc("Shortest CJK character n-gram emitted for a run of ideographs/kana (a run shorter than this is emitted whole).", ge=1)
    ] = 2
    recall_cjk_ngram_max: Annotated[int, doc("Longest CJK character n-gram emitted for a run of ideographs/kana.", ge=1)] = 3
    recall_cjk_split_scripts: Annotated[
        bool,
        doc(
            "Cut a CJK run where it changes between kanji, hiragana and katakana before making n-grams, so Japanese n-grams do not straddle a word and its particle or okurigana (焼いている -> 焼 + いている). Chinese text is all ideographs and is unaffected."
        ),
    ] = True
    recall_word_min_chars: Annotated[
        int, doc("Latin/Cyrillic words shorter than this are dropped (pure numbers are always kept).", ge=1)
    ] = 2
    recall_fold_english_suffixes: Annotated[
        bool, doc("Fold English plurals and possessives (cats -> cat, boxes -> box, stories -> story) in both documents and queries.")
    ] = True
    recall_extra_stop_names: Annotated[
        list[str],
        doc(
            "Names of the user or the character stripped from lexical texts like the master and character names (how companions address their user in Japanese and Chinese, which would otherwise match every memory)."
        ),
    ] = msgspec.field(default_factory=lambda: ["ご主人様", "ご主人", "主人"])
    recall_stop_name_min_chars: Annotated[
        int, doc("Master/character names (stop names) shorter than this are not stripped from texts.", ge=1)
    ] = 2

    # BM25.
    recall_bm25_k1: Annotated[float, doc("Okapi BM25 term-frequency saturation k1.", ge=0)] = 1.5
    recall_bm25_b: Annotated[float, doc("Okapi BM25 document-length normalisation b (0 = none, 1 = full).", ge=0, le=1)] = 0.75
    recall_bm25_threshold: Annotated[
        float,
        doc(
            "Lexical hits below this normalised BM25 score are dropped (1.0 = every query term found once in a document of average length).",
            ge=0,
        ),
    ] = 0.1
    recall_bm25_skip_unseen_cjk_grams: Annotated[
        bool,
        doc(
            "An n-gram of a query that occurs in no stored memory and is shorter than a CJK run the tokenizer could not cut (Chinese; a kanji-only run in Japanese) does not weigh in the normalised BM25 score: most such n-grams straddle two words. Words, and Japanese pieces cut at a script change, still weigh when they occur nowhere. Without it a Chinese question rarely reaches recall_bm25_threshold."
        ),
    ] = True
    recall_bm25_compact_dead_ratio: Annotated[
        float,
        doc(
            "A term's postings are compacted when this fraction of them belongs to removed documents; the whole index is renumbered when this fraction of its document slots is dead.",
            gt=0,
            le=1,
        ),
    ] = 0.25
    recall_index_persist: Annotated[
        bool,
        doc(
            "Keep the facts' recall index on disk (recall_segment.bin beside facts.json: token hashes, ids and byte offsets, no memory text), written when a character stops and by the offline import, so the next wake loads it instead of re-tokenising every fact. A segment that no longer matches the views, the journal or these settings is ignored and the index rebuilt."
        ),
    ] = True
    recall_index_initial_capacity: Annotated[
        int, doc("Document slots (lexical) and matrix rows (vectors) allocated up front; both double when full.", ge=1)
    ] = 1024
    recall_bm25_list_postings_max: Annotated[
        int,
        doc(
            "A term's postings stay in plain lists until it has this many (or a query reads it); then they move to growing numpy arrays.",
            ge=1,
        ),
    ] = 256
    recall_bm25_compact_min_slots: Annotated[
        int, doc("The whole lexical index is never renumbered while it has fewer dead document slots than this.", ge=0)
    ] = 1024

    # Vectors.
    recall_cosine_threshold: Annotated[
        float,
        doc(
            "Vector hits below this cosine similarity are dropped. Model-specific, so the embedding model's profile.json sets it unless you do: use 0.15 (paraphrases score about 0.2-0.6, unrelated memories mostly below 0.15), e5 0.8 (unrelated pairs score 0.69-0.81). With use+e5 each vector leg uses its own model's value instead.",
            ge=-1,
            le=1,
        ),
    ] = 0.15

    # Fusion and budgets.
    recall_budget_each: Annotated[
        int,
        doc(
            "Hits kept from each leg (lexical, vector) after thresholding, before fusion (the reference keeps 4; 8 measured better on LoCoMo).",
            ge=1,
        ),
    ] = 8
    recall_budget_total: Annotated[int, doc("Most results returned by a query recall after Reciprocal Rank Fusion.", ge=1)] = 8
    recall_rrf_k: Annotated[int, doc("Reciprocal Rank Fusion constant k in 1/(k + rank), ranks starting at 1.", ge=0)] = 60
    recall_time_budget: Annotated[int, doc("Most results returned by a time-only recall (nearest the window first).", ge=1)] = 8

    recall_legs: Annotated[str, doc("Which legs a query recall uses: both (BM25 + vectors, fused), bm25 or vector (for measurements).")] = (
        "both"
    )
    recall_journal_fallback_rows: Annotated[
        int,
        doc(
            "Beyond the reference: a query of a character without any long-term entry searches this many of its newest raw-journal turns by BM25 (rows of tier journal); 0 turns it off.",
            ge=0,
        ),
    ] = 2000
    recall_uncovered_turns: Annotated[
        int,
        doc(
            "Beyond the reference: a query recall also searches this many of the newest raw-journal turns that no long-term memory covers yet (not mined for facts yet, their extraction failed or is backed off, or no model is configured) by BM25, fused with the long-term entries as one more leg; such rows are of tier turn and name their session_id. A turn counts as covered once an extraction over it finished. A query scoped to subjects never sees them. 0 turns it off.",
            ge=0,
        ),
    ] = 2000
    recall_turn_vectors: Annotated[
        bool,
        doc(
            "Embed the uncovered turns (recall_uncovered_turns) in the background, in memory only, so that they also get a vector leg per embedding model in the fusion; false: BM25 only for them."
        ),
    ] = True
    recall_turn_leg_weight: Annotated[
        float,
        doc(
            "Weight of each of the uncovered turns' legs (BM25, and a vector leg per embedding model) in the Reciprocal Rank Fusion, where each of the index's legs weighs 1: a turn at rank r adds weight / (recall_rrf_k + r). 0.5 gave the best LoCoMo dev recall@8 with the last session unmined (bench/README.md); higher weights find more of that session's turns and push out more facts.",
            gt=0,
        ),
    ] = 0.5
    recall_turn_keys: Annotated[
        bool,
        doc(
            "Beyond the reference: the journal turns a fact was learnt from are more keys of that fact (LongMemEval's key expansion). The newest recall_uncovered_turns covered turns are searched by BM25, and each matching turn ranks the facts whose source span (the time span of the turns of their extraction) holds it, fused as one more leg weighing recall_turn_keys_weight. Only facts extracted from the journal name such a span. Off: on LoCoMo dev it gave +0.006 fully mined at weight 1, nothing with the last session unmined (docs/RECALL.md)."
        ),
    ] = False
    recall_turn_keys_weight: Annotated[
        float,
        doc(
            "recall_turn_keys: the weight of the facts-by-their-turns leg in the Reciprocal Rank Fusion (each of the index's legs weighs 1).",
            gt=0,
        ),
    ] = 0.5
    recall_rerank_base_url: Annotated[
        str,
        doc(
            "Beyond the reference: your own re-ranker. When set, a query recall's fused top recall_rerank_top_n rows are re-ordered by POST {base_url}/rerank (llama.cpp, vLLM, TEI, Infinity, Jina/Cohere-style APIs) before the recall_budget_total cut; a failure or a late answer keeps the fused order. Include /v1 when the server serves it there. See docs/RECALL.md."
        ),
    ] = ""
    recall_rerank_model: Annotated[str, doc("The re-ranker's model name, sent as model when set.")] = ""
    recall_rerank_api_key: Annotated[str, doc("Sent to the re-ranker as a Bearer token when set (never logged).")] = ""
    recall_rerank_field: Annotated[
        str, doc("The request field that carries the candidates: documents (llama.cpp, vLLM, Jina, Cohere, Infinity) or texts (TEI).")
    ] = "documents"
    recall_rerank_top_n: Annotated[int, doc("How many fused candidates the re-ranker re-orders.", ge=2)] = 20
    recall_rerank_timeout_seconds: Annotated[
        float,
        doc(
            "How long a query recall waits for the re-ranker before answering in the fused order (the request itself is cut at the same time).",
            gt=0,
        ),
    ] = 3.0
    recall_rerank_concurrency: Annotated[int, doc("Most re-rank requests in flight at once, over every character.", ge=1)] = 2
    recall_llm_rerank: Annotated[
        bool,
        doc(
            "Beyond the reference: when a chat model is configured (its summary tier) and no recall_rerank_base_url is, an explicit recall (POST /query_memory without subjects: what the recall_memory tool sends; never /search_for_memory or /new_dialog) asks the chat model once to re-order its fused top recall_rerank_top_n, waiting at most recall_rerank_timeout_seconds; a late, failed or nonsensical answer keeps the fused order. Costs one model call per recall (docs/RECALL.md)."
        ),
    ] = False
    recall_query_max_chars: Annotated[int, doc("A query longer than this many characters is cut before searching.", ge=1)] = 2000
    recall_stem_english: Annotated[
        bool, doc("Cut plain English words to a light stem (plurals, -ed, -ing, -ly, final e) in documents and queries of the lexical leg.")
    ] = True
    recall_query_stopwords: Annotated[
        bool, doc("Drop English function words (what, did, the, ...) from queries of the lexical leg (a query of nothing else keeps them).")
    ] = True
    recall_query_time_hints: Annotated[
        bool,
        doc(
            'A time expression inside a query without \'time\' ("on 8 May 2023", "yesterday", 昨日) is taken out of the searched text and adds a second pair of legs restricted to that window, so entries of that time rank first.'
        ),
    ] = True
    recall_query_time_max_tokens: Annotated[
        int, doc("Longest time expression (in words; three times as many characters for CJK) looked for inside a query.", ge=1)
    ] = 8
    recall_query_time_max_attempts: Annotated[int, doc("Most candidate spans of one query tried as time expressions.", ge=1)] = 200
    recall_query_time_year_lookback: Annotated[
        int,
        doc(
            'A time hint that names a month but no year ("in June", "on Aug 15th", 6月) and finds no memories in the latest such month tries the same month up to this many years earlier and keeps the first that has memories (0 = never).',
            ge=0,
        ),
    ] = 10
    recall_query_unnamed_weight: Annotated[
        float,
        doc(
            "A query naming someone (a capitalised word such as Melanie, not the first word of a sentence) is also embedded without its names, and the vector leg searches (1 - w) * asked + w * unnamed; w is this share (0 = embed the query as asked only), so the name does not fill the leg with generic memories about that person.",
            ge=0,
            le=1,
        ),
    ] = 0.5
    recall_vector_hub_weight: Annotated[
        float,
        doc(
            "The vector leg of a query recall ranks by cosine(query, memory) - this * (memory . centroid of all the character's memory vectors), so memories close to everything (generic ones) stop crowding out specific ones; 0 = plain cosine. The cosine threshold still applies to the plain cosine.",
            ge=0,
        ),
    ] = 1.0
    recall_vector_hub_min_vectors: Annotated[
        int,
        doc(
            "The hubness correction (recall_vector_hub_weight) applies only once a character has this many memory vectors: in a small memory the centroid is mostly the few memories themselves, and subtracting it would favour the odd unrelated one.",
            ge=1,
        ),
    ] = 50

    recall_same_time_anchors: Annotated[
        int,
        doc(
            "A query recall adds a same-time leg to its fusion: the other legs fused, kept to the memories whose event falls on the calendar day (display time zone) of one of the first this-many fused hits. Memories of one conversation or one day tend to answer a question together, so one found well lifts the others of its day that ranked a little lower; 0 = no such leg.",
            ge=0,
        ),
    ] = 3
    recall_consensus_leg: Annotated[
        bool,
        doc(
            "Add a consensus leg to a query recall's fusion: the union of every leg's best recall_consensus_pool hits, re-ranked by the sum of each signal's z-score inside that pool (the BM25 score times recall_consensus_bm25_weight, and each embedding model's hubness-corrected cosine), so how far a memory stands above the others counts, not only its rank. Needs vectors; off by default (measured within noise on LoCoMo, see docs/BENCHMARKS.md)."
        ),
    ] = False
    recall_consensus_pool: Annotated[int, doc("Hits each leg contributes to the consensus leg's pool (recall_consensus_leg).", ge=1)] = 16
    recall_consensus_bm25_weight: Annotated[
        float, doc("Weight of the BM25 z-score in the consensus leg; each embedding model's cosine weighs 1.", ge=0)
    ] = 0.5

    # Vector upkeep (RecallActor) and query embedding.
    recall_embed_batch_size: Annotated[
        int, doc("Entries embedded per model-pool job while RecallActor backfills missing vectors (one job in flight per character).", ge=1)
    ] = 64
    recall_backfill_retry_seconds: Annotated[
        float, doc("After a failed backfill job, wait this long (real time) before the next one.", ge=0)
    ] = 5.0
    recall_query_embed_timeout_seconds: Annotated[
        float,
        doc("A query whose embedding has not come back from the model pool after this many seconds is answered from BM25 alone.", gt=0),
    ] = 2.0
    recall_index_wait_seconds: Annotated[
        float,
        doc(
            "A query that reaches a just-activated character before its facts and reflections are indexed waits at most this long for them, then is answered from what is indexed.",
            gt=0,
        ),
    ] = 10.0

    # Maintenance recall (Stage-2 candidates, synthesis related context).
    recall_coarse_oversample: Annotated[
        int, doc("Stage-2 coarse rank keeps this many times the budget before the optional LLM rerank.", ge=1)
    ] = 3

    # Rendering of recall results (render=markdown, the recall_memory tool output).
    recall_render_language: Annotated[
        str, doc("Language of rendered recall blocks and tool descriptions when a request names none: en, ja or zh.")
    ] = "en"
    recall_render_entry_max_tokens: Annotated[int, doc("A rendered memory text is cut to this many tokens (never dropped).", ge=1)] = 400
    recall_render_line_overhead_tokens: Annotated[
        int, doc("Tokens allowed on a rendered line beyond its text (number, tag, date).", ge=0)
    ] = 40
    recall_render_total_max_tokens: Annotated[
        int,
        doc("Token budget of a whole rendered block, header included; lines past it are dropped (the first line is always kept).", ge=1),
    ] = 2204

    def rerank_endpoint(self) -> Endpoint:
        """The re-ranker (recall_rerank_base_url, _model, _api_key, _timeout_seconds)."""
        return Endpoint(
            base_url=self.recall_rerank_base_url,
            model=self.recall_rerank_model,
            api_key=self.recall_rerank_api_key,
            timeout_seconds=self.recall_rerank_timeout_seconds,
        )

    def __post_init__(self) -> None:
        if self.recall_rerank_field not in ("documents", "texts"):
            raise ValueError("recall_rerank_field must be documents or texts")
        if self.recall_legs not in RECALL_LEGS:
            raise ValueError(f"recall_legs must be one of {', '.join(RECALL_LEGS)}")
        if self.recall_render_language not in RECALL_RENDER_LANGUAGES:
            raise ValueError(f"recall_render_language must be one of {', '.join(RECALL_RENDER_LANGUAGES)}")
