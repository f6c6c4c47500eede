"""The block map's buckets, shared by the block index (core/monitor/kv_events.py) and the KV
view: a module of its own so that the view's legend needs neither pyzmq nor msgspec.

A group's ``cells`` count resident blocks by age bucket and reuse bucket: age bucket i holds
ages below AGE_EDGES_S[i] (the last one, the rest); reuse bucket 0 the blocks no later chain
reused, bucket i >= 1 those reused REUSE_EDGES[i - 1] times or more (and fewer than the next
edge)."""

AGE_EDGES_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
REUSE_EDGES = (1, 2, 4, 8, 16, 32)
