"""The base of every error caused by user input (config, workload, checkpoint, plugin).

The CLI prints these as one clear line instead of a traceback.
"""


class ServelabError(Exception):
    """Bad input; the message names the key, file, line or plugin at fault."""


class ConfigError(ServelabError, ValueError):
    """A config value that is well-typed but not allowed here; the message names the key."""


class WorkloadError(ServelabError, ValueError):
    """A workload file or setting that cannot be used; the message names the file/line or key."""
