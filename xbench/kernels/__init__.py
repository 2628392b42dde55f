"""MLA decode primitives: partial attention, merge, gather and splice, on several backends.

The names below are imported when first asked for: reading the backend registry
(``xbench.kernels.backend``, what ``xbench fit`` and ``env`` read) must not import torch,
which ``api`` and ``selection`` need (about 1.7 s on the 2-vCPU VM).
"""

from importlib import import_module

_EXPORTS = {
    "gather_kv": "xbench.kernels.api",
    "merge_partials": "xbench.kernels.api",
    "mla_partial_attention": "xbench.kernels.api",
    "splice_kv": "xbench.kernels.api",
    "BACKENDS": "xbench.kernels.backend",
    "BackendUnavailable": "xbench.kernels.backend",
    "get_backend": "xbench.kernels.backend",
    "DensePages": "xbench.kernels.selection",
    "random_topk": "xbench.kernels.selection",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
