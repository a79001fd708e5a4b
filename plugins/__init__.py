"""Built-in policy plugins: one folder per kind, one file per policy."""
