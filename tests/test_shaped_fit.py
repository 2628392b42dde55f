"""The shaped-link tests' own rule (tests/shaped_fit.py): what a sitting may fit, given the
share of the CPUs the hypervisor took during its probe."""

import time
from pathlib import Path

import pytest
from shaped_fit import stolen_while, within

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

GOODPUT = 23.91e6  # the shaped link's, B/s


@pytest.mark.parametrize(
    ("fitted", "stolen", "passes"),
    [
        (23.81e6, 0.01, True),  # a clean sitting (sessions 49-50)
        (22.58e6, 0.077, True),  # session 50: 5.6 % slow with 7.7 % taken
        (20.78e6, 0.138, True),  # session 51: 13.1 % slow with 13.8 % taken
        (22.58e6, 0.005, False),  # as slow with nothing taken: a miss
        (22.58e6, None, False),  # the share not read: the tolerance alone
        (25.00e6, 0.138, False),  # faster than the link: what the hypervisor took is no excuse
        (11.95e6, 0.138, False),  # half the link: a wrong fit, whatever was taken
    ],
)
def test_a_sitting_may_fit_slow_by_what_the_hypervisor_took(fitted, stolen, passes):
    assert within(GOODPUT, fitted, 0.03, stolen) is passes


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="no /proc/stat: not Linux")
def test_the_share_taken_is_read_from_proc_stat():
    result, stolen = stolen_while(lambda: time.sleep(0.1) or "slept")
    assert result == "slept" and 0.0 <= stolen <= 1.0  # idle time counts: jiffies passed
