"""The hot loop: :class:`~servelab.engine.engine.Engine` (schedule -> build batch -> execute ->
apply), the token-budget :class:`~servelab.engine.scheduling.QueueScheduler`, batch building,
clocks, drafting glue, swap-pool sizing, step totals. Imports only ``servelab.core``; no torch."""
