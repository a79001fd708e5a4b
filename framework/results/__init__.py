"""What a run leaves behind: the request writer and the run's end (``writer``), per-request metrics and
the summary (``metrics``, ``fairness``), per-replica and cluster figures, the printed table (``report``),
the banner and the loggers (W&B)."""
