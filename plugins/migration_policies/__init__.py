"""Built-in migration policies (``migration_policy=<name>``): which running requests of a cluster move
live to another replica."""

from .drain import DrainPolicy
from .llumnix import LlumnixPolicy
from .none import NoMigration

BUILTIN = [NoMigration, DrainPolicy, LlumnixPolicy]
