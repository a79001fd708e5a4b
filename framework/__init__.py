"""servelab: a plugin-based research framework for the scheduling and memory policies of LLM serving."""
