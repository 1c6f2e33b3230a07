"""The etcd key space of one cluster and the JSON written under it.

``<prefix>/nodes/<node id>``  -> {"node": id, "url": advertise URL}, attached to the node's lease
``<prefix>/shards/<NNNN>``    -> {"node": id, "url": ...}, attached to the owner's lease
``<prefix>/drain/<node id>``  -> {} (no lease): the node is being drained
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    @property
    def root(self) -> str:
        """Every key of the cluster starts with this."""
        return f"{self.prefix.rstrip('/')}/"

    @property
    def nodes(self) -> str:
        return f"{self.prefix.rstrip('/')}/nodes/"

    @property
    def shards(self) -> str:
        return f"{self.prefix.rstrip('/')}/shards/"

    @property
    def drain(self) -> str:
        return f"{self.prefix.rstrip('/')}/drain/"

    def node(self, node_id: str) -> str:
        return self.nodes + node_id

    def shard(self, shard: int) -> str:
        return f"{self.shards}{shard:04d}"

    def drained(self, node_id: str) -> str:
        return self.drain + node_id


@dataclass(frozen=True)
class Member:
    node: str
    url: str


def encode_member(member: Member) -> bytes:
    return json.dumps({"node": member.node, "url": member.url}).encode()


def decode_member(raw: bytes) -> Member | None:
    """The member named by a key's value, or None for a value that is not one."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("node"), str) or not isinstance(value.get("url"), str):
        return None
    return Member(node=value["node"], url=value["url"])


def tail(key: str, prefix: str) -> str:
    return key[len(prefix) :]
