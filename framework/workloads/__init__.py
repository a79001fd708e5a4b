"""Where requests come from: synthetic, jsonl, traces, hash-id traces, text prompts and the
held-out corpus; the tokenizers and chat template they use."""
