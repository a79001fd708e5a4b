"""The contracts ``servelab check-plugin expert_cache=<name>`` checks, by name: what each promises.

Apart from the stage (:mod:`servelab.kit.conformance_expert_cache`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stage, which imports the kit.
"""

EXPERT_CACHE_CONTRACTS = {
    "capacity never exceeded": "every resident set (the first and every answer of keep) is a bool mask "
                               "[moe_layers, ep, experts_per_rank] with at most cache_slots experts per rank and layer",
    "routed experts resident when priced": "in the simulator every routed expert is either resident or loaded "
                                           "(a miss) before its layer runs, and a layer with misses waits for them",
    "deterministic caches": "the same routing gives the same resident sets (a fresh plugin too), and the same run "
                            "twice the same figures",
}
