"""KV tiers below the GPU pool (docs/kv-tiers.md): the tiered store (a KV connector), a tier shared by a
simulated cluster's replicas, the real bytes on an engine that computes tokens, and their figures."""
