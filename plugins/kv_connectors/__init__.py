"""Built-in KV connectors (``kv_connector=<name>``): the doors KV enters or leaves an engine by."""

from .builtin import NoConnector, PDLocalConnector, PDProcessConnector, PDSimConnector, TiersConnector
from .multi import MultiConnector

BUILTIN = [NoConnector, TiersConnector, PDSimConnector, PDLocalConnector, PDProcessConnector, MultiConnector]
