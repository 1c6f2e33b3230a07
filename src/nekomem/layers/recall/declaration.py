"""The recall layer's declaration: the in-memory index, nothing on disk (see
:mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from nekomem.domain.layers import RECALL, LayerSpec

DECLARATION = LayerSpec(RECALL, "nekomem.layers.recall.actor:RecallActor")
