"""servelab: a plugin-based research framework for the scheduling and memory policies of LLM serving.

The plugin interfaces live in :mod:`servelab.interfaces`; the Python API in :mod:`servelab.api`.
"""

from .hookspecs import hookimpl
from .request import Request, SamplingParams

__all__ = ["LLM", "Request", "SamplingParams", "compose", "hookimpl"]
__version__ = "0.1.0"


def __getattr__(name):  # keep `import servelab` light: torch and Hydra load on first use
    if name in ("LLM", "compose"):
        from . import api

        return getattr(api, name)
    raise AttributeError(name)
