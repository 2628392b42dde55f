"""A validate case's compute calls (attention, merge, gather, splice), launched as a serving
engine launches decode: on a GPU replayed from CUDA graphs (``--launch graph``), each graph
holding one call on one input set; else called as they are (CPU, ``--launch eager``).

The kernel sweep the model is fitted from times graph replays on GPUs. Eager calls from
Python add tens to hundreds of microseconds of host work to each phase, which the model's
device terms do not hold, so validate's compute phases would test the host instead.

Every graph is captured before the case's first timed sample (``prepare``): a capture is an
eager run plus the recording, and inside a timed sample it would be timed. The same
bookkeeping holds on CPUs, where nothing is captured: a call not prepared is refused there
too, so the CPU tests check that ``prepare`` covers every call the paths make.
"""

from __future__ import annotations


class CaseCalls:
    """The compute calls of one case, by key ``(what, input set)``."""

    def __init__(self, graphs: bool):
        self.graphs: dict | None = {} if graphs else None
        self.outputs: dict = {}  # a graph's outputs, rewritten by each replay
        self.known: set = set()
        self.preparing = False

    def __call__(self, key: tuple, body):
        """``body()`` for ``key``: run (eager), or replayed from its graph. While preparing,
        only recorded (eager: None returned) or captured (graph: its outputs returned, which
        a later call's capture may read, as a fetch's merge reads its attention's)."""
        if self.preparing:
            self.known.add(key)
            if self.graphs is not None and key not in self.graphs:
                self._capture(key, body)
            return self.outputs.get(key)
        if key not in self.known:
            raise RuntimeError(f"validate's {key[0]} on set {key[1]} was not prepared")
        if self.graphs is None:
            return body()
        self.graphs[key].replay()
        return self.outputs[key]

    def _capture(self, key: tuple, body) -> None:
        from xbench.kernels.bench import Clock

        result = {}

        def run():  # (returned too: a stand-in capture in the CPU tests keeps them)
            result["out"] = body()
            return result["out"]

        # an eager run on a side stream (allocations, Triton's tuning), then the recording,
        # whose outputs each replay rewrites
        self.graphs[key] = Clock("cuda").capture(run)
        self.outputs[key] = result["out"]
