"""The outbox's declaration: ``outbox.ndjson``, the durable background work. It ends every
erasure relay (it scrubs the copies of any erased text its records hold, then answers)."""

from __future__ import annotations

from nekomem.domain.layers import OUTBOX, LayerSpec
from nekomem.stores.layout import OUTBOX_FILE

DECLARATION = LayerSpec(OUTBOX, "nekomem.layers.outbox.actor:OutboxActor", files=(OUTBOX_FILE,), scrubs=("turns", "entries"))
