"""Tensors: the model worker and executors (one process, tensor parallel), the KV pool, the
sampler, quantisation, and the model itself (``exec.model``)."""
