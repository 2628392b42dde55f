"""``xbench validate``: real route / fetch / local between two ranks against the fitted model.

``worker`` runs inside the two launched ranks; ``summary`` turns their samples and a
profile into per-case errors and the MAPE.
"""

from xbench.validate.summary import phase_errors, summarize_validation, validation_errors
from xbench.validate.worker import FETCH_LAYOUTS, OPTIONS, ValidateConfig

__all__ = [
    "FETCH_LAYOUTS",
    "OPTIONS",
    "ValidateConfig",
    "phase_errors",
    "summarize_validation",
    "validation_errors",
]
