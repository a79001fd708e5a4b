"""Paged KV-cache kernels (Triton) beside the pure-torch reference each is tested against."""

from .backend import ATTENTION_BACKENDS, AttentionOps, select_attention_backend

__all__ = ["ATTENTION_BACKENDS", "AttentionOps", "select_attention_backend"]
