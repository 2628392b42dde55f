"""The shaped-link tests' own rule (tests/shaped_fit.py): what their sittings' fits say,
given the share of the CPUs the hypervisor took during each probe."""

import time
from pathlib import Path

import pytest
from shaped_fit import judge, stolen_while

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

GOODPUT = 23.91e6  # the shaped link's, B/s


@pytest.mark.parametrize(
    ("sittings", "verdict"),
    [
        ([(23.81e6, 0.010)], "found"),  # a clean sitting
        ([(22.58e6, 0.077), (23.91e6, 0.020)], "found"),  # a noisy miss, then a clean find
        ([(20.29e6, 0.091), (17.00e6, 0.177)], "noisy"),  # two noisy misses (a Slurm test's)
        ([(21.98e6, 0.129), (20.78e6, 0.138)], "noisy"),  # two noisy misses (a netns test's)
        ([(20.29e6, 0.091), (22.58e6, 0.005)], "missed"),  # a clean sitting missed too
        ([(20.29e6, 0.091), (22.58e6, None)], "missed"),  # the share not read: no excuse
        ([(25.00e6, 0.138), (25.10e6, 0.150)], "missed"),  # faster than the link: no excuse
    ],
)
def test_a_miss_is_excused_only_slow_and_when_every_sitting_was_noisy(sittings, verdict):
    assert judge(GOODPUT, sittings, 0.03) == verdict


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat: not Linux")
def test_the_share_taken_is_read_from_proc_stat():
    result, stolen = stolen_while(lambda: time.sleep(0.1) or "slept")
    assert result == "slept" and 0.0 <= stolen <= 1.0  # idle time counts: jiffies passed
