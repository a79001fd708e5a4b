"""More than one engine: replicas behind a router, colocated or prefill/decode disaggregated
(docs/cluster.md). ``simulated``: one discrete-event loop on the virtual clock; ``procs/``: one engine
process per replica on the wall clock; ``build``: a cluster from a config. The KV hand-off between
replicas is a KV connector (:mod:`servelab.kv.pd`)."""
