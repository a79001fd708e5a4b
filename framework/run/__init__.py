"""One run end to end: config schema, stack building (one engine, or a cluster's replicas), the
session (run, write, log; a cluster job in ``cluster_run``: on the virtual clock one loop, on the
wall clock engine processes in ``proc_cluster``; what all write in ``results``), the
run loop, preflight checks, ``block_size=auto``, the swap pool's size, metrics and fairness,
loggers, the report and the banner."""
