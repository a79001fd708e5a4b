"""Built-in step-time models."""

from .measured import MeasuredTime
from .profile import ProfileTime
from .roofline import RooflineTime

BUILTIN = [MeasuredTime, RooflineTime, ProfileTime]
