"""The inference backends of the embedding service: a model that takes strings (with its
own tokenizer op) or one fed token ids from a ``tokenizers`` tokenizer, and the batching
of texts into bounded model calls (see :mod:`nekomem.models.embeddings`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from nekomem.config.embeddings import EmbeddingSettings

_TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class Disable(Exception):
    """Internal: loading failed with a reason code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.reason = f"{code}: {detail}"


def plan_batches(lengths: Sequence[int], max_batch: int, budget: int, padded: bool, padding_ratio: float = 0.0) -> list[list[int]]:
    """Group item indices into inference batches, shortest first.

    ``padded`` True: a batch costs count x longest length (token models pad to the longest);
    False: it costs the sum of lengths (string-input models). A batch never exceeds
    max_batch items, nor budget unless it holds a single item. ``padding_ratio`` (> 0, padded
    only): a batch is also cut before its padded size would pass this many times its real
    tokens (the model's time grows with the padded size, so padding is paid in full).
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    cost_sum = 0
    for index in order:
        length = max(int(lengths[index]), 1)
        if current:
            # Sorted ascending, so this item is the batch's longest one.
            cost = (len(current) + 1) * length if padded else cost_sum + length
            wasteful = padded and padding_ratio > 0 and cost > padding_ratio * (cost_sum + length)
            if len(current) >= max_batch or cost > budget or wasteful:
                batches.append(current)
                current, cost_sum = [], 0
        current.append(index)
        cost_sum += length
    if current:
        batches.append(current)
    return batches


class Backend(Protocol):
    kind: str
    batch_invariant: bool
    """True when a text's vector does not depend on the other texts of its call (beyond
    float noise), so the texts of several callers may share one model call."""

    def infer(self, texts: list[str]) -> np.ndarray:
        """Raw (unnormalised) float32 [len(texts), dim] embeddings; raises on failure."""
        ...


class StringInputBackend:
    """A graph with one string tensor input that tokenises inside (custom ops)."""

    kind = "use-string-input"
    # The bundled USE graph is dynamically quantised: each call scales its activations by
    # the whole batch's range, so a text's vector moves with its batch-mates (by up to 0.016
    # per coordinate). Each caller's texts therefore run as a call of their own.
    batch_invariant = False

    def __init__(self, session: Any, input_name: str, output_name: str, settings: EmbeddingSettings) -> None:
        self._session = session
        self._input = input_name
        self._output = output_name
        self._settings = settings

    def infer(self, texts: list[str]) -> np.ndarray:
        s = self._settings
        rows: list[np.ndarray | None] = [None] * len(texts)
        for batch in plan_batches([len(t) for t in texts], s.embedding_max_batch_size, s.embedding_batch_char_budget, padded=False):
            feed = {self._input: np.array([texts[i] for i in batch], dtype=object)}
            out = np.asarray(self._session.run([self._output], feed)[0], dtype=np.float32)
            if out.ndim != 2 or out.shape[0] != len(batch):
                raise ValueError(f"model output has shape {out.shape} for a batch of {len(batch)}")
            for row, index in zip(out, batch, strict=True):
                rows[index] = row
        return np.stack(rows)  # type: ignore[arg-type]


class TokenizerBackend:
    """model.onnx fed by a HuggingFace tokenizer, with pooling of token outputs."""

    kind = "hf-tokenizer"
    # Padding is masked out of attention and pooling, and the e5 graph quantises per row:
    # a text's vector is the same alone or in any batch (tests/test_embedding_batching.py).
    batch_invariant = True

    def __init__(self, session: Any, tokenizer: Any, output_name: str, settings: EmbeddingSettings, pooling: str | None = None) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._output = output_name
        self._settings = settings
        self._pooling = pooling or settings.embedding_pooling
        self._inputs: dict[str, Any] = {}
        for spec in session.get_inputs():
            if spec.name not in _TOKEN_INPUTS:
                raise Disable("unsupported_model", f"unknown model input {spec.name!r}")
            if spec.type not in _INT_TYPES:
                raise Disable("unsupported_model", f"input {spec.name!r} has type {spec.type}")
            self._inputs[spec.name] = _INT_TYPES[spec.type]
        if "input_ids" not in self._inputs:
            raise Disable("unsupported_model", "model has no input_ids input")
        self._pad_id = self._find_pad_id(tokenizer)

    @staticmethod
    def _find_pad_id(tokenizer: Any) -> int:
        padding = tokenizer.padding
        if padding and isinstance(padding.get("pad_id"), int):
            return int(padding["pad_id"])
        for token in ("<pad>", "[PAD]", "<|endoftext|>"):
            found = tokenizer.token_to_id(token)
            if found is not None:
                return int(found)
        # Padded positions are masked out, so any id works when the vocabulary names none.
        return 0

    def infer(self, texts: list[str]) -> np.ndarray:
        s = self._settings
        encodings = self._tokenizer.encode_batch(texts)
        ids = [enc.ids or [self._pad_id] for enc in encodings]
        rows: list[np.ndarray | None] = [None] * len(texts)
        lengths = [len(x) for x in ids]
        for batch in plan_batches(
            lengths, s.embedding_max_batch_size, s.embedding_batch_token_budget, True, s.embedding_batch_padding_ratio
        ):
            width = max(len(ids[i]) for i in batch)
            input_ids = np.full((len(batch), width), self._pad_id, dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, index in enumerate(batch):
                input_ids[row, : len(ids[index])] = ids[index]
                mask[row, : len(ids[index])] = 1
            feed: dict[str, np.ndarray] = {}
            for name, dtype in self._inputs.items():
                if name == "input_ids":
                    value = input_ids
                elif name == "attention_mask":
                    value = mask
                elif name == "token_type_ids":
                    value = np.zeros_like(input_ids)
                else:
                    value = np.broadcast_to(np.arange(width, dtype=np.int64), input_ids.shape).copy()
                feed[name] = value.astype(dtype, copy=False)
            out = np.asarray(self._session.run([self._output], feed)[0], dtype=np.float32)
            pooled = self._pool(out, mask)
            if pooled.shape[0] != len(batch):
                raise ValueError(f"model output has shape {out.shape} for a batch of {len(batch)}")
            for vec, index in zip(pooled, batch, strict=True):
                rows[index] = vec
        return np.stack(rows)  # type: ignore[arg-type]

    def _pool(self, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if out.ndim == 2:
            return out  # already one vector per text
        if out.ndim != 3 or out.shape[:2] != mask.shape:
            raise ValueError(f"model output has shape {out.shape}, expected [batch, tokens, dim] or [batch, dim]")
        pooling = self._pooling
        if pooling == "cls":
            return out[:, 0, :]
        if pooling == "last":
            last = mask.sum(axis=1) - 1
            return out[np.arange(out.shape[0]), last, :]
        weights = mask.astype(np.float32)[:, :, None]
        mean: np.ndarray = (out * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
        return mean
