"""The hot loop: :class:`~servelab.engine.engine.Engine` (schedule -> build batch -> execute ->
apply), the token-budget :class:`~servelab.engine.scheduling.QueueScheduler`, step work and batch
building, clocks, drafting glue, step totals (the one place step records are summed). Imports
only ``servelab.core``; no torch."""
