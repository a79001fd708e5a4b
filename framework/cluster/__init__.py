"""More than one engine: replicas behind a router, and prefill/decode disaggregation (docs/cluster.md)."""
