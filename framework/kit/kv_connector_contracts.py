"""The contracts ``servelab check-plugin kv_connector=<name>`` checks, by name: what each promises.

Apart from the stage (:mod:`servelab.kit.conformance_kv_connector`) so that the kit's contract table
(:mod:`servelab.kit.conformance`) reads them without importing the stage, which imports the kit.
"""

KV_CONNECTOR_CONTRACTS = {
    "valid matches": "get_num_new_matched_tokens answers 0 <= n <= num_tokens - num_computed_tokens - 1, and the "
                     "same answer when asked again (no side effects)",
    "every load answered": "every asynchronous load is reported received, every request whose blocks the connector "
                           "kept is reported sent, each once and only those",
}
