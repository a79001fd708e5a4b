"""One run end to end: config schema, stack building (one engine, or a cluster's replicas), the
session (run, write, log; a cluster job in ``cluster_run``, what both write in ``results``), the
run loop, preflight checks, ``block_size=auto``, the swap pool's size, metrics and fairness,
loggers, the report and the banner."""
