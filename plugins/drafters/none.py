"""No speculative decoding."""

from servelab.plugin_api import SpeculativeDrafter


class NoDrafter(SpeculativeDrafter):
    """Proposes nothing: every decode step computes exactly one token."""

    name = "none"

    def propose(self, seqs, k):
        return [[] for _ in seqs]
