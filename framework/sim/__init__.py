"""``backend=sim``: the executor without tensors and the fitted step profiles."""
