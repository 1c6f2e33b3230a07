"""Cluster settings: nekomem on many machines, shards owned through leases in etcd.

Cluster mode is off while ``cluster_etcd_url`` is empty (the default): nothing here is
read, no etcd is needed, and the memory root keeps its single-node layout.
"""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc


class ClusterSettings(Section, frozen=True):
    cluster_etcd_url: Annotated[
        str,
        doc(
            "Base URL of etcd's v3 JSON gateway (e.g. http://127.0.0.1:2379). Empty: single node (the default), "
            "no etcd, the single-node layout of the memory root."
        ),
    ] = ""
    cluster_node_id: Annotated[
        str, doc("This node's id in the cluster (letters, digits, '-', '_', '.'). Empty: the host name and the port.")
    ] = ""
    cluster_advertise_url: Annotated[
        str, doc("The URL other nodes forward requests to (e.g. http://10.0.0.5:48912). Empty: http://<host>:<port>.")
    ] = ""
    cluster_lease_ttl_seconds: Annotated[
        float, doc("TTL of this node's etcd lease: a node silent this long loses its shards to the others.", ge=1.0)
    ] = 10.0
    cluster_shards: Annotated[
        int,
        doc(
            "Number of shards (fixed for a cluster's life; every node must agree): shard = stable_hash(NFC(name)) mod this.", ge=1, le=4096
        ),
    ] = 256
    cluster_key_prefix: Annotated[str, doc("Prefix of every etcd key of this cluster (several clusters may share one etcd).")] = "/nekomem"
    cluster_fence_fraction: Annotated[
        float,
        doc(
            "The fencing deadline: a node writes to its shards only until this fraction of the lease TTL has passed since "
            "the last keepalive etcd acknowledged (measured from when it was sent), well before the lease can expire.",
            gt=0.0,
            lt=1.0,
        ),
    ] = 0.6
    cluster_poll_seconds: Annotated[
        float,
        doc(
            "How often a node renews its lease (at most a third of the TTL is used). While its watch on etcd's keys is down, it "
            "also reads the membership and the shard owners this often.",
            gt=0,
        ),
    ] = 1.0
    cluster_resync_seconds: Annotated[
        float,
        doc(
            "While the watch on etcd's keys is up (a change is seen as soon as etcd makes it), how often a node still reads the "
            "membership and the shard owners in full, as a safety net.",
            gt=0,
        ),
    ] = 30.0
    cluster_watch_backoff_max_seconds: Annotated[
        float,
        doc("Longest wait before a broken watch on etcd is opened again (the wait doubles from 0.1 s up to this).", gt=0),
    ] = 5.0
    cluster_owner_wait_seconds: Annotated[
        float,
        doc("How long a request for a shard that is moving or has no owner waits for one before answering 503 with Retry-After.", ge=0),
    ] = 5.0
    cluster_forward_timeout_seconds: Annotated[
        float, doc("Timeout of a request forwarded to the owner of its shard (it covers the owner's own ask timeout).", gt=0)
    ] = 60.0
    cluster_forward_connections: Annotated[int, doc("Keep-alive connections the forwarding client keeps per owner node.", ge=1)] = 32
    cluster_move_timeout_seconds: Annotated[
        float, doc("How long a moving shard waits for its in-flight requests before its characters are passivated anyway.", gt=0)
    ] = 10.0
    cluster_lock_wait_seconds: Annotated[
        float,
        doc(
            "How long a new owner waits for the flock of a shard still held by a paused previous owner before it relies on the "
            "etcd fence alone (the paused process refuses every write once it wakes past its fencing deadline).",
            ge=0,
        ),
    ] = 2.0
    cluster_fenced_retry_seconds: Annotated[
        float,
        doc(
            "The periodic work of a character this node may not write now (a take-over being prepared while the dead owner's "
            "lease runs out, or a shard being let go): every layer's timers and the outbox's records wait, and are looked at "
            "again after this long.",
            gt=0,
        ),
    ] = 1.0
    cluster_aggregate_timeout_seconds: Annotated[
        float,
        doc(
            "How long a cluster-wide answer (/health?scope=cluster, /metrics?scope=cluster, /reload, /cluster/status) waits for each node.",
            gt=0,
        ),
    ] = 10.0
    cluster_proxy_slot: Annotated[
        int,
        doc(
            "This node's position among the front proxy's servers (deploy/haproxy.cfg: server node<k>); 0: none. Every "
            "character answer then carries it (x-nekomem-slot, the owner's slot on a forwarded answer), and the proxy sends the "
            "character's next requests straight to its owner.",
            ge=0,
        ),
    ] = 0
    cluster_etcd_timeout_seconds: Annotated[float, doc("Timeout of one request to etcd.", gt=0)] = 2.0
