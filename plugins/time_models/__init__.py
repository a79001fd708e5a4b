"""Built-in step-time models."""

from .auto import AutoTime
from .calibrated_roofline import CalibratedRooflineTime
from .measured import MeasuredTime
from .op_profile import OpProfileTime
from .profile import ProfileTime
from .roofline import RooflineTime

BUILTIN = [MeasuredTime, RooflineTime, ProfileTime, CalibratedRooflineTime, OpProfileTime, AutoTime]
