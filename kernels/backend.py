"""Choosing the attention implementation: ``attention_backend = auto | torch | triton``.

Both backends expose the same two operations with the contracts documented in
:mod:`servelab.kernels.reference`: ``store_kv`` and ``paged_attention``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

from servelab.core.errors import ServelabError

ATTENTION_BACKENDS = ("auto", "torch", "triton")


class AttentionBackendError(ServelabError, RuntimeError):
    """The requested attention backend cannot run here; the message says why."""


@dataclass(frozen=True)
class AttentionOps:
    """The paged-cache operations a model runner needs; see ``servelab.kernels.reference`` for contracts."""

    name: str
    store_kv: Callable[..., None]
    paged_attention: Callable[..., torch.Tensor]


def triton_interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def select_attention_backend(name: str, device: torch.device) -> AttentionOps:
    """Return the ops for ``name`` on ``device``; ``auto`` is Triton on CUDA and torch elsewhere.

    Raises ``ValueError`` for an unknown name and ``RuntimeError`` when Triton cannot run here.
    """
    if name not in ATTENTION_BACKENDS:
        raise AttentionBackendError(f"attention_backend={name!r} is not one of {list(ATTENTION_BACKENDS)}")
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_importable() else "torch"
    if name == "torch":
        from . import reference  # noqa: PLC0415 - only the chosen backend is loaded

        return AttentionOps("torch", reference.store_kv, reference.paged_attention)
    if device.type != "cuda" and not triton_interpreted():
        raise AttentionBackendError(
            "attention_backend=triton needs a CUDA device, or TRITON_INTERPRET=1 in the environment "
            f"to run the kernels in Triton's CPU interpreter (slow; for tests). Device here: {device}."
        )
    if not _triton_importable():
        raise AttentionBackendError("attention_backend=triton but the `triton` package is not installed "
                                    "(pip install 'servelab[triton]')")
    from . import triton_ops  # noqa: PLC0415 - triton: an optional extra, loaded once chosen
    from .triton_store_kv import interpreter_available  # noqa: PLC0415 - as above

    if device.type != "cuda" and not interpreter_available():
        raise AttentionBackendError("attention_backend=triton on CPU: TRITON_INTERPRET=1 must be set before "
                                    "triton is first imported in this process")

    return AttentionOps("triton", triton_ops.store_kv, triton_ops.paged_attention)


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401, PLC0415 - is it installed?
    except ImportError:
        return False
    return True
