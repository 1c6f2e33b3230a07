"""nekomem on many machines: shards owned through etcd leases, fenced writes, moves.

Nothing here runs unless ``cluster_etcd_url`` is set.
"""
