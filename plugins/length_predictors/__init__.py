"""Built-in output-length predictors (``length_predictor=<name>``)."""

from .learned import LearnedPredictor
from .noisy_oracle import NoisyOraclePredictor
from .none import NoLengthPredictor
from .oracle import OraclePredictor

BUILTIN = [NoLengthPredictor, OraclePredictor, NoisyOraclePredictor, LearnedPredictor]
