"""Where the data shipped inside the package lives: the trained checkpoints
(``experiments/train_tiny`` made them). A path constant, no I/O, so any layer may read it."""

from pathlib import Path

PACKAGED_CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"
PACKAGED_MODELS = ("tiny_code", "tiny_code_draft")
