"""Fitting cost-model coefficients to probe and kernel samples."""

from xbench.fit.profile_fit import fit_profile

__all__ = ["fit_profile"]
