"""servelab: a plugin-based research framework for the scheduling and memory policies of LLM serving.

Layers, each importing only those before it (import-linter contracts in ``pyproject.toml``):
``core`` (the plugin contract, no torch) <- ``engine`` (the step) <- ``exec`` | ``sim`` |
``workloads`` <- ``run`` <- ``api`` <- ``serve`` | ``kit`` <- ``cli``. Plugin authors import
:mod:`servelab.plugin_api`; the Python API is :mod:`servelab.api`.
"""

from servelab import _moved

from servelab.core.hookspecs import hookimpl
from servelab.core.request import Request, SamplingParams

__all__ = ["LLM", "Request", "SamplingParams", "compose", "hookimpl"]
__version__ = "0.1.0"

_moved.install()  # old flat import paths (servelab.interfaces, ...) keep working, with a warning


def __getattr__(name):  # keep `import servelab` light: torch and Hydra load on first use
    if name in ("LLM", "compose"):
        from servelab import api

        return getattr(api, name)
    raise AttributeError(name)
