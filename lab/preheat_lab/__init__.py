"""Preheat's lab, dev only: what runs the product against a real cluster and measures it.

`closedloop` runs the operator against replayed load on the local cluster (preheat vs reactive only),
`loadgen` replays a trace as real requests, `bench_scale` and `bench_cluster` are the operator-at-scale
and local-cluster benchmarks. The local cluster itself is the sibling package `preheat_cluster`.
"""
