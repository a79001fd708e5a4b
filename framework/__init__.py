"""servelab: a plugin-based research framework for the scheduling and memory policies of LLM serving.

Layers, each importing only those before it (import-linter contracts in ``pyproject.toml``):
``core`` (the plugin contract, no torch) <- ``engine`` (the step) <- ``plugin_api`` <- ``exec`` |
``sim`` | ``workloads`` | ``config`` <- ``kv`` (the connectors) <- ``time_model_api`` <- ``assemble``
<- ``results`` <- ``cluster`` <- ``run`` (the job drivers) <- ``api`` <- ``serve`` | ``kit`` <- ``cli`` |
``testing``. Plugin authors import :mod:`servelab.plugin_api` (their tests
:mod:`servelab.testing`); the Python API is :mod:`servelab.api`.
"""

from servelab import _moved

from servelab.core.hookspecs import hookimpl
from servelab.core.request import Request, SamplingParams

__all__ = ["LLM", "Request", "SamplingParams", "compose", "hookimpl"]
__version__ = "0.1.0"

_moved.install()  # old flat import paths (servelab.interfaces, ...) keep working, with a warning


def __getattr__(name):  # keep `import servelab` light: torch and Hydra load on first use
    if name in ("LLM", "compose"):
        from servelab import api  # noqa: PLC0415 - see above

        return getattr(api, name)
    raise AttributeError(name)
