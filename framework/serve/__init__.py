"""``servelab serve``: the OpenAI-compatible server in front of a composed stack."""
