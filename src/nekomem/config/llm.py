"""LLM tier settings.

Three tiers (summary, correction, emotion) each name an OpenAI-compatible endpoint.
``llm_base_url`` / ``llm_model`` / ``llm_api_key`` set every tier at once; the
``llm_<tier>_*`` fields override one tier. An empty base URL means "no endpoint": the LLM
stages of that tier are skipped and reported in /health.
"""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc

TIERS = ("summary", "correction", "emotion")


class LLMSettings(Section, frozen=True):
    llm_base_url: Annotated[
        str, doc("Base URL of the OpenAI-compatible API for every tier, e.g. http://127.0.0.1:8080/v1. Empty: no LLM.")
    ] = ""
    llm_model: Annotated[str, doc("Model name sent to every tier.")] = ""
    llm_api_key: Annotated[str, doc("API key sent as a Bearer token to every tier (never logged).")] = ""
    llm_summary_base_url: Annotated[str, doc("Override of llm_base_url for the summary tier.")] = ""
    llm_summary_model: Annotated[str, doc("Override of llm_model for the summary tier.")] = ""
    llm_summary_api_key: Annotated[str, doc("Override of llm_api_key for the summary tier.")] = ""
    llm_correction_base_url: Annotated[str, doc("Override of llm_base_url for the correction tier.")] = ""
    llm_correction_model: Annotated[str, doc("Override of llm_model for the correction tier.")] = ""
    llm_correction_api_key: Annotated[str, doc("Override of llm_api_key for the correction tier.")] = ""
    llm_emotion_base_url: Annotated[str, doc("Override of llm_base_url for the emotion tier.")] = ""
    llm_emotion_model: Annotated[str, doc("Override of llm_model for the emotion tier.")] = ""
    llm_emotion_api_key: Annotated[str, doc("Override of llm_api_key for the emotion tier.")] = ""
    llm_summary_timeout_seconds: Annotated[
        float, doc("Override of llm_timeout_seconds for the summary tier; 0 means use llm_timeout_seconds.", ge=0, le=110)
    ] = 0.0
    llm_correction_timeout_seconds: Annotated[
        float, doc("Override of llm_timeout_seconds for the correction tier; 0 means use llm_timeout_seconds.", ge=0, le=110)
    ] = 0.0
    llm_emotion_timeout_seconds: Annotated[
        float, doc("Override of llm_timeout_seconds for the emotion tier; 0 means use llm_timeout_seconds.", ge=0, le=110)
    ] = 0.0
    llm_timeout_seconds: Annotated[
        float, doc("Timeout of one LLM HTTP request (the reference's summary tier uses 30 s).", gt=0, le=110)
    ] = 30.0
    llm_review_timeout_seconds: Annotated[float, doc("Timeout of one review_recent request (hard limit 110 s).", gt=0, le=110)] = 110.0
    llm_max_retries: Annotated[
        int, doc("Retries of a failed or malformed LLM answer before the call is recorded as failed.", ge=0, le=10)
    ] = 3
    llm_backoff_base_seconds: Annotated[
        float, doc("First retry delay; doubles on each retry (1, 2, 4 s by default, before jitter).", ge=0)
    ] = 1.0
    llm_backoff_max_seconds: Annotated[float, doc("Largest retry delay.", ge=0)] = 8.0
    llm_max_output_tokens: Annotated[
        int, doc("Output-token limit sent with every task (output guard); an answer that reaches it keeps its complete items.", ge=16)
    ] = 4096
    llm_review_max_output_tokens: Annotated[int, doc("Output-token limit of review_recent.", ge=16)] = 8192
    llm_rerank_timeout_seconds: Annotated[
        float, doc("Timeout of one rerank request (the user may be waiting; the reference uses 8 s).", gt=0, le=110)
    ] = 8.0
    llm_rerank_max_retries: Annotated[
        int, doc("Retries of a failed rerank call (the reference falls back to the coarse order at once).", ge=0, le=10)
    ] = 0
    llm_output_tokens_param: Annotated[
        str,
        doc(
            "Request field that carries the output-token limit. auto: send max_completion_tokens (OpenAI) and switch to max_tokens (older servers) for an endpoint that refuses it by name; either name pins it.",
            pattern="^(auto|max_completion_tokens|max_tokens)$",
        ),
    ] = "auto"
    llm_response_format: Annotated[
        str,
        doc(
            "Structured output requested from the model. auto: response_format json_schema, falling back per endpoint to json_object with the schema, then to none (schema stated in the prompt) when the endpoint refuses it; json_schema, json_object or none pins that level for every endpoint.",
            pattern="^(auto|json_schema|json_object|none)$",
        ),
    ] = "auto"
    llm_negotiation_reprobe_seconds: Annotated[
        float,
        doc(
            "After a probe showed that an endpoint's unexplained errors are not about response_format (the next level failed the same way), such errors are plain failures for this long before the next probe.",
            ge=0,
        ),
    ] = 300.0
    llm_backoff_jitter: Annotated[
        float,
        doc(
            "Share of each retry delay that is random: the delay is shortened by up to this fraction, so clients that failed together do not retry together. 0 makes delays exact.",
            ge=0,
            le=1,
        ),
    ] = 0.5
