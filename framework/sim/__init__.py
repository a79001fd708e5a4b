"""``backend=sim``: the executor without tensors, and what prices a step on the virtual clock:
fitted step profiles, measured operator tables, the calibrated roofline's operator formulas and
the step pricer they share."""
