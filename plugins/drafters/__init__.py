"""Built-in speculative drafters."""

from .none import NoDrafter

BUILTIN = [NoDrafter]
