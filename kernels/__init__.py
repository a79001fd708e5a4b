"""Paged KV-cache kernels (Triton) beside the pure-torch reference each is tested against.

This folder is the package ``servelab.kernels``. Where the repository root is on ``sys.path`` (a
script, notebook or ``python -c`` started there; ``python run.py``) it is also found as a top-level
``kernels``, a name that belongs to Hugging Face's hub package, which ``transformers`` probes for
(``find_spec("kernels")``, then an import). Imported under that name it stands aside: it loads the
hub package when one is installed elsewhere on ``sys.path``, else leaves an empty namespace package
in its place (what a plain folder would be, and what transformers reads as "not installed").
"""

if __name__ == "kernels":
    import importlib.machinery as _machinery
    import importlib.util as _util
    import os as _os
    import sys as _sys

    _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    _spec = _machinery.PathFinder.find_spec(
        "kernels", [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root])
    _hub = _spec.loader if _spec is not None and _spec.origin is not None else None  # an installed package's
    if _spec is None or _hub is None:  # no installed package of that name (at most other plain folders): nothing here
        _spec = _machinery.ModuleSpec("kernels", None, is_package=True)
    _module = _util.module_from_spec(_spec)
    _sys.modules["kernels"] = _module  # the import system hands out what sys.modules holds once this file ran
    if _hub is not None:
        _hub.exec_module(_module)
else:
    from .backend import ATTENTION_BACKENDS, AttentionOps, select_attention_backend

    __all__ = ["ATTENTION_BACKENDS", "AttentionOps", "select_attention_backend"]
