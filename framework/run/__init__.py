"""One run end to end: config schema, stack building, the session (run, write, log), metrics,
loggers, the report and the banner."""
