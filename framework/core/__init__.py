"""The plugin contract and the data it exchanges: the plugin interfaces (the executor's and the
KV connector's too), the table of plugin kinds and each kind's context, requests and sequences,
the registry and its hooks, step batches and step work, errors, model/hardware shapes, the
policies' cost model, sampling seeds, the packaged data's paths. Imports no torch, triton or Hydra
and nothing else of servelab."""
