"""KV entering or leaving an engine: the connectors. ``tiers/`` (host and disk tiers below the GPU: the
store, a cluster's shared tier, their real bytes, figures), ``pd/`` (the prefill->decode hand-off: priced
in the simulator, copied between engines of one process, sent between engine processes), ``migrate_sim``
(a running request's KV moving between a simulated cluster's replicas), ``migrate_proc`` (its real bytes
between engine processes) and ``link`` (pricing bytes over a
cluster's links)."""
