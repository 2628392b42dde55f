"""The fit of a TCP link shaped by tc (tests/test_netns_tcp.py, tests/test_slurm_cluster.py):
a probe in one sitting, ``xbench fit`` on it, and the fitted rate against the link's
goodput.

Three of about twenty suite runs on the 2-vCPU VMs (sessions 44-48) fitted 20.9-22.4 MB/s
against the link's 23.91, each time while the same files alone passed; in one of them two of
four samples at each of two sizes were 29-84 % slow. The cause, caught since: the link runs
on the kernel's clock, so while the hypervisor holds the VM's CPUs it carries nothing, and
a sitting fits slow by about the share of the CPUs' time the hypervisor took during its
probe (/proc/stat's steal): 22.58 MB/s with 7.7 % taken (session 50), 21.98 and 20.78 with
12.9 and 13.8 % (session 51; clean sittings take 0.2-2.7 % and fit within 1 %). So a
sitting may fit slow by the tolerance plus that share, and no faster than the tolerance; a
fit that misses that gets one more sitting; a fit that is wrong misses in both, and the
failure shows both sittings, each with the share the hypervisor took and each size's median
and range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from xbench.core.profile import load_profile
from xbench.results.schema import PROBE_SAMPLES
from xbench.results.store import read_table

SITTINGS = 2


def _steal_jiffies() -> tuple[int, int] | None:
    """(steal, total) CPU jiffies since boot from /proc/stat, or None where it is not read."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user and nice)
    return (fields[7], sum(fields[:8])) if len(fields) >= 8 else None


def stolen_while(work, *args, **kwargs):
    """(``work(*args, **kwargs)``, the share of the CPUs' time the hypervisor took
    meanwhile, or None where /proc/stat does not say)."""
    before = _steal_jiffies()
    result = work(*args, **kwargs)
    after = _steal_jiffies()
    if before is None or after is None or after[1] <= before[1]:
        return result, None
    return result, (after[0] - before[0]) / (after[1] - before[1])


def size_medians(probe: Path) -> str:
    """Each size's median (ms) and the range of its samples, one size a line."""
    samples = read_table(probe, PROBE_SAMPLES)
    measured = samples[~samples.warmup & (samples.size_bytes > 0)]
    lines = []
    for size, group in measured.groupby("size_bytes"):
        ms = group.value.to_numpy(float) / 1e3
        lines.append(
            f"  {int(size) // 1024} KiB: median {np.median(ms):.2f} ms "
            f"({ms.min():.2f}-{ms.max():.2f}, {len(ms)} samples)"
        )
    return "\n".join(lines)


def fitted_rate(xbench, probe: Path, out: Path) -> float:
    """The last segment's bandwidth (B/s) that ``xbench fit`` finds in ``probe``."""
    r = xbench("fit", probe, "--base", "profiles/h100-priors.toml", "--out", out)
    assert r.returncode == 0, r.stderr
    return load_profile(out).fabric("tcp").segments[-1].beta.value


def within(goodput: float, beta: float, rel: float, stolen: float | None) -> bool:
    """``beta`` no more than ``rel`` above ``goodput`` and no more than ``rel`` plus the
    hypervisor's share ``stolen`` below it (the link carries nothing while the VM waits)."""
    return goodput * (1 - rel - (stolen or 0.0)) <= beta <= goodput * (1 + rel)


def assert_fit_finds(goodput: float, sit, xbench, tmp_path: Path, rel: float = 0.03) -> float:
    """Fit the probe of sitting n, ``sit(n)`` -> (probe folder, the hypervisor's share
    during it or None), for n = 0, then 1 only where 0 missed; assert one is ``within``
    ``goodput`` and return its rate."""
    told = []
    for n in range(SITTINGS):
        probe, stolen = sit(n)
        beta = fitted_rate(xbench, probe, tmp_path / f"fit-{n}.toml")
        took = "not read" if stolen is None else f"{stolen:.1%}"
        told.append(
            f"sitting {n}: fitted {beta / 1e6:.2f} MB/s against a goodput of "
            f"{goodput / 1e6:.2f}, the hypervisor's share of the CPUs during its probe "
            f"{took}\n{size_medians(probe)}"
        )
        print(told[-1])
        if within(goodput, beta, rel, stolen):
            return beta
    pytest.fail(
        f"no sitting found the goodput ({rel:.0%} allowed, and below it the hypervisor's "
        "share):\n" + "\n".join(told)
    )
