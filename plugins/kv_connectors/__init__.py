"""Built-in KV connectors (``kv_connector=<name>``): the doors KV enters or leaves an engine by."""

from .builtin import MigrateSimConnector, NoConnector, PDLocalConnector, PDProcessConnector, PDSimConnector, TiersConnector
from .multi import MultiConnector

BUILTIN = [NoConnector, TiersConnector, PDSimConnector, MigrateSimConnector, PDLocalConnector, PDProcessConnector, MultiConnector]
