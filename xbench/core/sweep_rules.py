"""What a timed sweep's configuration may hold (kernel and validate sweeps): the rules the
commands check before torch loads, and the configurations check again when they are built
from JSON (``--config-from``, ``xbench check``, the ranks). No torch, no numpy: importing
this costs the command nothing."""

from __future__ import annotations

from xbench.errors import XbenchError

DTYPES = ("bf16", "fp32")
LAUNCHES = ("graph", "eager")  # how a sample's calls start on a GPU (eager on CPUs)
RANKS = (1, 2)  # the kernel sweep alone, or beside one peer waiting in MPI


def resolve_launch(device: str, launch: str) -> str:
    """--launch for --device (kernel and validate sweeps): auto is graph on a GPU (as serving
    engines run decode) and eager on CPUs; graph needs a GPU."""
    on_gpu = device.startswith("cuda")
    if launch == "auto":
        return "graph" if on_gpu else "eager"
    if launch not in LAUNCHES:
        raise XbenchError(f"unknown --launch {launch!r}", "pick auto, graph or eager")
    if launch == "graph" and not on_gpu:
        raise XbenchError("--launch graph needs a CUDA device", "use --launch eager on CPU")
    return launch


def check_repeats(dtype: str, rounds: int, samples: int, runs: int) -> None:
    """What a timed sweep (kernel or validate) needs: a dtype it times, something measured,
    a launch."""
    if dtype not in DTYPES:
        raise XbenchError(f"unknown dtype {dtype!r}", f"pick {' or '.join(DTYPES)}")
    if rounds < 1 or samples < 1:
        raise XbenchError(
            f"--rounds {rounds} --samples {samples}: nothing would be measured",
            "pass --rounds and --samples of 1 or more",
        )
    if runs < 1:
        raise XbenchError(f"--runs {runs} launches nothing", "pass --runs 1 or more")


def check_sweep(dtype: str, rounds: int, samples: int, ranks: int, runs: int) -> None:
    """The kernel sweep's rules."""
    check_repeats(dtype, rounds, samples, runs)
    if ranks not in RANKS:
        raise XbenchError(
            f"--np {ranks}: the sweep runs alone or beside one peer", "pass --np 1 or 2"
        )
