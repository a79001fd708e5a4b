"""Built-in speculative drafters."""

from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter
from .none import NoDrafter

BUILTIN = [NoDrafter, NgramDrafter, DraftModelDrafter]
