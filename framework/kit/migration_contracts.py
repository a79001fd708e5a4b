"""The contracts ``servelab check-plugin migration_policy=<name>`` checks, by name: what each promises.

Apart from the stage (:mod:`servelab.kit.conformance_migration`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stage, which imports the kit.
"""

MIGRATION_CONTRACTS = {
    "valid decisions": "decide returns Migrate decisions naming running requests that are not migrating, each once, "
                       "to another replica that is not draining, and never raises",
    "tokens equal": "every request's output tokens and finish reason equal the run without migration "
                    "(migration_policy=none)",
    "none lost or twice": "every request ends exactly once, and no KV block is held at the end",
    "one replica": "at every step of every replica a request is live on at most one replica, and on none only "
                   "while its last copy is on the link",
    "deterministic": "the same cluster run twice moves the same requests at the same times and gives the same "
                     "token times",
}
