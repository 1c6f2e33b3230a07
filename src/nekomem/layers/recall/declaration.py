"""The recall layer's declaration: the in-memory index and its derived files (see
:mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from nekomem.domain.layers import RECALL, LayerSpec

# In an entry erasure's relay: the owner's IndexRemove reaches this mailbox before the
# relay does, so the erasure is answered only once the segment and the vector block that
# held the entry are off the disk.
DECLARATION = LayerSpec(RECALL, "nekomem.layers.recall.actor:RecallActor", scrubs=("entries",))
