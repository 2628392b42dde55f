"""The fit of a TCP link shaped by tc (tests/test_netns_tcp.py, tests/test_slurm_cluster.py):
a probe in one sitting, ``xbench fit`` on it, and the fitted rate against the link's
goodput.

Three of about twenty suite runs on the 2-vCPU VMs fitted 20.9-22.4 MB/s
against the link's 23.91, each time while the same files alone passed; in one of them two of
four samples at each of two sizes were 29-84 % slow. The cause, caught since: the link runs
on the kernel's clock, so while the hypervisor holds the VM's CPUs it carries nothing.
Sittings during which the hypervisor took 4.2-17.7 % of the CPUs' time (/proc/stat's steal)
fitted 4.7-29 % slow, by no fixed ratio to the share taken; clean sittings
take 0.2-2.7 % and fit within 1 %. So a fit that misses gets one more sitting; where every
sitting missed slow while the hypervisor took more than ``NOISY`` of the CPUs, the machine
could not judge the link and the test is skipped with the figures; otherwise it fails. Either
way the message shows each sitting with the share the hypervisor took and each size's median
and range. A fit faster than the link fails whatever was taken.
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


# the hypervisor's share of the CPUs past which a sitting cannot judge the link (clean
# sittings: 0.2-2.7 %; the misses caught with it read 4.2-17.7 %, one at 4.2 % fitting
# 4.7 % slow while other work loaded the VM)
NOISY = 0.03


def judge(goodput: float, sittings: list[tuple[float, float | None]], rel: float) -> str:
    """ "found" where a sitting's fit (B/s) is within ``rel`` of ``goodput``; "noisy" where
    each missed slow with the hypervisor's share above NOISY; else "missed"."""
    if any(beta == pytest.approx(goodput, rel=rel) for beta, _ in sittings):
        return "found"
    noisy = all(beta < goodput and (stolen or 0.0) > NOISY for beta, stolen in sittings)
    return "noisy" if noisy else "missed"


def assert_fit_finds(goodput: float, sit, xbench, tmp_path: Path, rel: float = 0.03) -> float:
    """Fit the probe of sitting n, ``sit(n)`` -> (probe folder, the hypervisor's share
    during it or None), for n = 0, then 1 only where 0 missed; return the rate of the one
    within ``rel`` of ``goodput``, skip where the machine was too noisy to judge (``judge``),
    else fail."""
    told, sittings = [], []
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
        sittings.append((beta, stolen))
        verdict = judge(goodput, sittings, rel)
        if verdict == "found":
            return beta
    if verdict == "noisy":
        pytest.skip(
            f"the hypervisor took more than {NOISY:.0%} of the CPUs in every sitting, which "
            "fitted slow; the link cannot be judged on this machine now:\n" + "\n".join(told)
        )
    pytest.fail(f"no sitting found the goodput ({rel:.0%} allowed):\n" + "\n".join(told))
