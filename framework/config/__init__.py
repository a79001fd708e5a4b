"""The config: the typed schema Hydra composes into (:mod:`~servelab.config.schema`, the workloads'
options in :mod:`~servelab.config.workloads`), every group option in Hydra's ConfigStore
(:mod:`~servelab.config.groups`), one-line messages for bad input (:mod:`~servelab.config.messages`),
multirun bookkeeping (:mod:`~servelab.config.sweeps`) and a checkpoint's recorded shape
(:mod:`~servelab.config.checkpoint`). Every public name is importable from here."""

from servelab.config.schema import *  # noqa: F403
from servelab.config.workloads import *  # noqa: F403
from servelab.config.groups import *  # noqa: F403
from servelab.config.messages import *  # noqa: F403
from servelab.config.sweeps import *  # noqa: F403
from servelab.config.checkpoint import *  # noqa: F403
from servelab.config.messages import config_error_message, unknown_key_message  # noqa: F401
from servelab.core.executor import BackendConfig  # noqa: F401
from servelab.core.packaged import PACKAGED_CHECKPOINTS, PACKAGED_MODELS  # noqa: F401
