"""Local embedding model settings (onnxruntime on CPU), the built-in models' folders, and
the per-model settings their ``profile.json`` carries (cosine thresholds)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from nekomem.config.base import Section, doc
from nekomem.config.endpoint import Endpoint

EMBEDDING_MODEL_KINDS = ("auto", "use-string-input", "hf-tokenizer")
EMBEDDING_POOLINGS = ("mean", "cls", "last")
# The models scripts/fetch_model.py installs, by name -> folder (relative to the project).
BUILTIN_MODELS = {"use": "models/use-multilingual-v3", "e5": "models/multilingual-e5-small"}
REMOTE_MODEL = "remote"  # an OpenAI-compatible /v1/embeddings endpoint (embedding_remote_*)
# "remote" alone replaces the bundled models; after them ("use+e5+remote") it is one more
# vector leg beside theirs.
EMBEDDING_MODELS = ("use", "e5", "use+e5", REMOTE_MODEL, "use+remote", "e5+remote", "use+e5+remote")
PROFILE_FILE = "profile.json"
# Settings a model profile may set (when the user did not): cosines are model-specific.
PROFILE_SETTINGS = ("recall_cosine_threshold", "fact_dedup_cosine_threshold", "longterm_refine_cosine_threshold")


class EmbeddingSettings(Section, frozen=True):
    embedding_enabled: Annotated[bool, doc("Use the local embedding model at all; false disables vectors for the whole process.")] = True
    embedding_model: Annotated[
        str,
        doc(
            "Which model embeds: e5 (multilingual-e5-small, 4-bit), use (Universal Sentence Encoder multilingual v3), use+e5 (both; recall then runs one vector leg per model, fused by RRF), remote (your own OpenAI-compatible /v1/embeddings endpoint in place of the bundled models, the embedding_remote_* settings; see docs/RECALL.md), or use+remote, e5+remote, use+e5+remote (your endpoint as one more vector leg beside the bundled models; when it fails, queries answer from the other legs). An installed model's profile.json supplies its prefixes and its cosine thresholds unless those are set explicitly. Ignored when embedding_model_dir is set."
        ),
    ] = "use+e5"
    embedding_model_dir: Annotated[
        str,
        doc(
            "A custom model folder (model.onnx, plus tokenizer.json for tokenizer models) instead of embedding_model; empty uses embedding_model. A relative path is looked up from the working directory, then from the project root."
        ),
    ] = ""
    embedding_model_kind: Annotated[
        str,
        doc(
            "auto (detect from the files present), use-string-input (string tensor input, tokenizer inside the graph) or hf-tokenizer (model.onnx + tokenizer.json)."
        ),
    ] = "auto"
    embedding_load_delay_seconds: Annotated[
        float, doc("After start, wait this long before loading the model in the background (load_now cuts the wait short).", ge=0)
    ] = 0.0
    embedding_intra_op_threads: Annotated[
        int,
        doc(
            "onnxruntime intra-op threads of each embedding model session; 0 = the physical cores this process may run on. One thread spends the least CPU per text (a second one saves little time on short queries and costs ~10-20% more CPU), and leaves the other cores to the server under load.",
            ge=0,
        ),
    ] = 1
    embedding_inference_threads: Annotated[
        int,
        doc(
            "Model calls that may run at once (each on its own thread, each using embedding_intra_op_threads); 0 = the physical cores divided by the intra-op threads. All of them share the sessions, so a second one costs scratch memory, not a second model. Two: while one thread runs a model call the other takes the next batch on the other core (on 2 cores, +6% to +58% queries/s over one thread under concurrent queries when the second core had room; see docs/EMBEDDING-INFERENCE.md). Background work (the backfill, duplicate checks) always leaves one of them to users' queries.",
            ge=0,
        ),
    ] = 2
    embedding_max_batch_size: Annotated[
        int,
        doc(
            "Most texts in one inference call, and in one micro-batch: the queries of concurrent requests that arrive while a batch runs are embedded together in the next, up to this many texts (and up to an even share of the waiting texts among the inference threads, so that a free thread leaves the others their part).",
            ge=1,
        ),
    ] = 32
    embedding_passage_chunk_texts: Annotated[
        int,
        doc(
            "Passages (the vector backfill, refinement) are embedded in requests of at most this many texts; a user's query waits for one such chunk at most, then goes first. Only when every model's vectors are independent of their batch-mates (e5); with use a call's passages stay one request, so their vectors come out as they always did.",
            ge=1,
        ),
    ] = 8
    embedding_cpu_mem_arena: Annotated[
        bool,
        doc(
            "Keep onnxruntime's CPU memory arena: the tensors of the largest batch seen stay reserved for the process's life. Off, they return to the allocator after each call.",
        ),
    ] = False
    embedding_trim_memory_seconds: Annotated[
        float,
        doc(
            "After an inference batch, when no other request waits, give the heap memory inference freed back to the OS (glibc malloc_trim), at most once per this many seconds; 0 never does.",
            ge=0,
        ),
    ] = 1.0
    embedding_batch_char_budget: Annotated[
        int,
        doc(
            "String-input models: most characters (sum over the texts) in one inference call; a longer single text still runs alone.", ge=1
        ),
    ] = 16_384
    embedding_batch_token_budget: Annotated[
        int,
        doc(
            "Tokenizer models: most padded tokens (batch size x longest sequence) in one inference call; a longer single text still runs alone.",
            ge=1,
        ),
    ] = 16_384
    embedding_batch_padding_ratio: Annotated[
        float,
        doc(
            "Tokenizer models: a batch (texts sorted by length) is cut before padding it to its longest text would make it more than this many times its real tokens; the model's time follows the padded size. 0 = no such cut.",
            ge=0,
        ),
    ] = 1.25
    embedding_max_text_chars: Annotated[int, doc("Texts are cut to this many characters before embedding.", ge=1)] = 4_000
    embedding_max_length: Annotated[int, doc("Tokenizer models: sequences are truncated to this many tokens.", ge=2)] = 512
    embedding_pooling: Annotated[
        str, doc("Tokenizer models whose output is per token: mean (masked mean), cls (first token) or last (last real token).")
    ] = "mean"
    embedding_query_prefix: Annotated[str, doc("Prepended to every text embedded as a query.")] = ""
    embedding_passage_prefix: Annotated[str, doc("Prepended to every text embedded as a passage.")] = ""
    embedding_output_name: Annotated[str, doc("Model output that holds the embeddings; empty means the first output.")] = ""

    # Your own embedding model behind an OpenAI-compatible endpoint (embedding_model = remote).
    embedding_remote_base_url: Annotated[
        str,
        doc(
            "embedding_model remote: the endpoint's base URL, up to and including /v1 (texts go to POST {base_url}/embeddings), e.g. http://127.0.0.1:11434/v1 for Ollama."
        ),
    ] = ""
    embedding_remote_model: Annotated[
        str, doc("embedding_model remote: the model name sent with every request (e.g. nomic-embed-text).")
    ] = ""
    embedding_remote_api_key: Annotated[str, doc("embedding_model remote: sent as a Bearer token when set (cloud APIs; never logged).")] = (
        ""
    )
    embedding_remote_dimensions: Annotated[
        int,
        doc(
            "embedding_model remote: ask the endpoint for vectors this wide (the OpenAI dimensions field, for models that can shorten theirs); 0 sends nothing and takes the width of the first answer.",
            ge=0,
        ),
    ] = 0
    embedding_remote_batch_size: Annotated[int, doc("embedding_model remote: most texts in one request.", ge=1)] = 64
    embedding_remote_concurrency: Annotated[
        int,
        doc(
            "embedding_model remote: most requests in flight to the endpoint at once. Requests run on threads of their own beside the inference thread, so a query that stops waiting for a slow endpoint (at 80% of its deadline) leaves its request running there; this bounds how many such requests, and threads, there can be.",
            ge=1,
        ),
    ] = 2
    embedding_remote_timeout_seconds: Annotated[
        float,
        doc(
            "embedding_model remote: one request's timeout. A failed or timed-out request fails that embedding only (a query answers from its other legs, a backfill is retried); the endpoint is never given up.",
            gt=0,
        ),
    ] = 20.0
    embedding_remote_retry_seconds: Annotated[
        float,
        doc("embedding_model remote: while the endpoint cannot be reached at start, how often to try again to learn its width.", gt=0),
    ] = 30.0

    def remote_endpoint(self) -> Endpoint:
        """The embedding endpoint (embedding_remote_base_url, _model, _api_key, _timeout_seconds)."""
        return Endpoint(
            base_url=self.embedding_remote_base_url,
            model=self.embedding_remote_model,
            api_key=self.embedding_remote_api_key,
            timeout_seconds=self.embedding_remote_timeout_seconds,
        )

    def __post_init__(self) -> None:
        if uses_remote(self.embedding_model) and not self.embedding_model_dir:
            if not self.embedding_remote_base_url.strip() or not self.embedding_remote_model.strip():
                raise ValueError("embedding_model remote needs embedding_remote_base_url and embedding_remote_model")
        if self.embedding_model not in EMBEDDING_MODELS:
            raise ValueError(f"embedding_model must be one of {', '.join(EMBEDDING_MODELS)}")
        if self.embedding_model_kind not in EMBEDDING_MODEL_KINDS:
            raise ValueError(f"embedding_model_kind must be one of {', '.join(EMBEDDING_MODEL_KINDS)}")
        if self.embedding_pooling not in EMBEDDING_POOLINGS:
            raise ValueError(f"embedding_pooling must be one of {', '.join(EMBEDDING_POOLINGS)}")


def uses_remote(model: str) -> bool:
    """Whether the embedding_model value names the remote endpoint (alone or as a leg)."""
    return REMOTE_MODEL in model.split("+")


def find_project_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above start (default: this module) holding pyproject.toml."""
    here = (start or Path(__file__)).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def resolve_model_dir(value: str, project_root: Path | None = None) -> Path:
    """Resolve a model folder setting.

    An absolute path is used as it is. A relative one is looked up from the working
    directory first, then from the project root; when neither exists the working-directory
    form is returned (so the missing-file reason names it).
    """
    path = Path(value).expanduser()
    if path.is_absolute():
        return path
    from_cwd = Path.cwd() / path
    if from_cwd.exists():
        return from_cwd
    root = project_root if project_root is not None else find_project_root()
    if root is not None and (root / path).exists():
        return root / path
    return from_cwd


def model_dirs(model: str, model_dir: str, project_root: Path | None = None) -> list[Path]:
    """The folder(s) of the configured model: the custom ``model_dir`` when set, else the
    built-in folder of each bundled name in ``model`` ("use", "e5", "use+e5"; "remote" has no
    folder)."""
    if model_dir:
        return [resolve_model_dir(model_dir, project_root)]
    return [resolve_model_dir(BUILTIN_MODELS[name], project_root) for name in model.split("+") if name != REMOTE_MODEL]


def read_profile(folder: Path) -> dict[str, Any]:
    """The folder's profile.json as a dict; {} when it is missing or unreadable."""
    try:
        data = json.loads((folder / PROFILE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def profile_settings(model: str, model_dir: str, project_root: Path | None = None) -> dict[str, float]:
    """The PROFILE_SETTINGS the configured model's profile(s) give. With two models the value
    is their mean (one stored vector then scores the mean of the two cosines), except the
    recall threshold: each recall leg then uses its own model's. A key some profile lacks is
    left out, as is everything when no profile is installed. The remote endpoint has no
    profile: beside a bundled model its leg takes recall_cosine_threshold, and the shared
    dedup thresholds are left to the settings (its cosines are not known here)."""
    per_model: list[Mapping[str, Any]] = []
    for folder in model_dirs(model, model_dir, project_root):
        given = read_profile(folder).get("settings")
        per_model.append(given if isinstance(given, dict) else {})
    if not model_dir and uses_remote(model) and per_model:
        per_model.append({})
    out: dict[str, float] = {}
    for key in PROFILE_SETTINGS:
        if key == "recall_cosine_threshold" and len(per_model) > 1:
            continue
        values = [m.get(key) for m in per_model]
        numbers = [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if values and len(numbers) == len(values):
            out[key] = round(sum(numbers) / len(values), 6)
    return out
