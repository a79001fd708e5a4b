"""The contracts ``servelab check-plugin kv_tier_policy=<name>`` checks, by name: what each promises.

Apart from the stages (:mod:`servelab.kit.conformance_kv_tiers`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stages, which import the kit.
"""

KV_TIER_CONTRACTS = {
    "valid answers": "every store / victim / demote answer names a tier that exists (a demotion: a farther one) "
                     "or None, and a victim the full tier holds",
    "loads return the stored blocks": "every block loaded from a tier is one stored there and neither moved nor "
                                      "dropped since (in the simulator: the same prefix digest)",
    "prefetches read stored blocks": "every block prefetched for a queued request is held by the tier it is read "
                                     "from, and admissions use no more prefetched blocks than were prefetched",
    "capacities respected": "no tier ever holds more blocks than its capacity; a block is in at most one tier",
    "no block lost while referenced": "every request ends and no GPU block stays held once the run ends",
    "deterministic": "the same run twice gives the same requests and the same figures",
}
