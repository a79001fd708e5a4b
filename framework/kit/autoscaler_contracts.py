"""The contracts ``servelab check-plugin autoscaler=<name>`` checks besides the migration kit's ("tokens
equal", "none lost or twice", "one replica", "deterministic"), by name: what each promises.

Apart from the stage (:mod:`servelab.kit.conformance_autoscaler`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stage, which imports the kit.
"""

AUTOSCALER_CONTRACTS = {
    "valid scaling": "decide returns ScaleUp (count >= 1) and ScaleDown (a serving replica, once) decisions the "
                     "cluster can carry out, and never raises",
    "within bounds": "after every decision at least cluster.min_replicas replicas serve or start, one at least "
                     "serves, and at most cluster.max_replicas hold GPUs (serving, draining or starting)",
}
