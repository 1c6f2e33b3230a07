"""Local embedding model settings (onnxruntime on CPU)."""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc

EMBEDDING_MODEL_KINDS = ("auto", "use-string-input", "hf-tokenizer")
EMBEDDING_POOLINGS = ("mean", "cls", "last")


class EmbeddingSettings(Section):
    embedding_enabled: Annotated[bool, doc("Use the local embedding model at all; false disables vectors for the whole process.")] = True
    embedding_model_dir: Annotated[
        str,
        doc(
            "Folder of the model (model.onnx, plus tokenizer.json for tokenizer models). A relative path is looked up from the working directory, then from the project root."
        ),
    ] = "models/use-multilingual-v3"
    embedding_model_kind: Annotated[
        str,
        doc(
            "auto (detect from the files present), use-string-input (string tensor input, tokenizer inside the graph) or hf-tokenizer (model.onnx + tokenizer.json)."
        ),
    ] = "auto"
    embedding_load_delay_seconds: Annotated[
        float, doc("After start, wait this long before loading the model in the background (load_now cuts the wait short).", ge=0)
    ] = 0.0
    embedding_intra_op_threads: Annotated[int, doc("onnxruntime intra-op threads of the embedding session.", ge=1)] = 2
    embedding_max_batch_size: Annotated[int, doc("Most texts in one inference call.", ge=1)] = 32
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
    embedding_max_text_chars: Annotated[int, doc("Texts are cut to this many characters before embedding.", ge=1)] = 4_000
    embedding_max_length: Annotated[int, doc("Tokenizer models: sequences are truncated to this many tokens.", ge=2)] = 512
    embedding_pooling: Annotated[
        str, doc("Tokenizer models whose output is per token: mean (masked mean), cls (first token) or last (last real token).")
    ] = "mean"
    embedding_query_prefix: Annotated[str, doc("Prepended to every text embedded as a query.")] = ""
    embedding_passage_prefix: Annotated[str, doc("Prepended to every text embedded as a passage.")] = ""
    embedding_output_name: Annotated[str, doc("Model output that holds the embeddings; empty means the first output.")] = ""

    def __post_init__(self) -> None:
        if self.embedding_model_kind not in EMBEDDING_MODEL_KINDS:
            raise ValueError(f"embedding_model_kind must be one of {', '.join(EMBEDDING_MODEL_KINDS)}")
        if self.embedding_pooling not in EMBEDDING_POOLINGS:
            raise ValueError(f"embedding_pooling must be one of {', '.join(EMBEDDING_POOLINGS)}")
