"""Tensors: the model worker and the executors (``backend=local``, ``tp``, and ``torch``, which
picks one of them), the KV pool, the sampler, quantisation, the operator timings behind
``servelab profile-ops``, and the model itself (``exec.model``)."""
