"""More than one engine, as one discrete-event simulation: replicas behind a router, and
prefill/decode disaggregation with the KV hand-off priced over the links (docs/cluster.md).
A layer beside ``exec``, ``sim`` and ``workloads``: it never imports them (a replica's executor
comes built)."""
