"""The plugin contract and the data it exchanges: interfaces, requests and sequences, the
registry and its hooks, errors, model/hardware shapes, step work, the policies' cost model,
sampling seeds. Imports no torch and nothing else of servelab."""
