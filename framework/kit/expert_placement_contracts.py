"""The contracts ``servelab check-plugin expert_placement=<name>`` checks, by name: what each promises.

Apart from the stage (:mod:`servelab.kit.conformance_expert_placement`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stage, which imports the kit.
"""

EXPERT_PLACEMENT_CONTRACTS = {
    "every expert placed": "every plan puts every expert of every MoE layer on at least one rank",
    "plan fits the layout": "every plan is [moe_layers, expert_parallel_size, slots_per_rank] expert ids in range: "
                            "each rank holds exactly the slots the memory plan reserved (its experts and replicas), "
                            "for every expert-parallel size the model allows",
    "deterministic plans": "the same load gives the same plan (a fresh plugin too), and the same run twice the same "
                           "figures",
}
