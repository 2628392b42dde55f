"""MLA decode primitives: partial attention, merge, gather and splice, on several backends."""

from xbench.kernels.api import (
    gather_kv,
    merge_partials,
    mla_partial_attention,
    splice_kv,
)
from xbench.kernels.backend import BACKENDS, BackendUnavailable, get_backend
from xbench.kernels.selection import DensePages, random_topk

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "DensePages",
    "gather_kv",
    "get_backend",
    "merge_partials",
    "mla_partial_attention",
    "random_topk",
    "splice_kv",
]
