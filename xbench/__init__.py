"""xbench: measure fabrics and MLA kernels, fit a cost model, decide route / fetch / local."""

__version__ = "0.1.0"
