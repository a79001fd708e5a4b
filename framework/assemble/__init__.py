"""Assembling a run from its config: checks across keys (``validate``), the executor and the engine
stack (``stack``), ``block_size=auto`` (``block_size``), preflight checks and the host swap pool."""
