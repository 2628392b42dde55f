"""What commands print for machines and for people: strict JSON, honest interval labels,
every format on every command that prints results, tables that fit 80 columns."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from xbench.cli.common import interval_label, strict_json
from xbench.core.stats import median_ci


def _no_constants(name):
    raise ValueError(f"not JSON: {name}")


def test_strict_json_has_no_nan_or_infinity():
    text = strict_json(
        [{"a": math.nan, "b": math.inf, "c": np.float64(-np.inf), "d": np.int64(3), "e": None}]
    )
    assert json.loads(text, parse_constant=_no_constants) == [
        {"a": None, "b": None, "c": None, "d": 3, "e": None}
    ]


@pytest.mark.parametrize("n, label", [(2, "50% CI"), (5, "93% CI"), (6, "96% CI"), (20, "95% CI")])
def test_the_interval_label_states_the_coverage_the_samples_give(n, label):
    _, _, coverage = median_ci(np.arange(float(n)))
    expected = "95% CI" if coverage >= 0.95 else label
    assert interval_label([coverage, 0.99]) == expected
    assert interval_label([coverage]) == expected


@pytest.mark.parametrize(
    "args",
    [
        ["env"],
        ["models"],
        ["decide", "--payload", "1KB", "--rows", "1", "--chunk", "1024"],
    ],
)
@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_machine_formats(xbench, tmp_path, args, fmt):
    extra = ["--out", tmp_path / "d.parquet"] if args[0] == "decide" else []
    r = xbench(*args, *extra, "--format", fmt)
    assert r.returncode == 0, r.stderr
    if fmt == "json":
        rows = json.loads(r.stdout, parse_constant=_no_constants)
        assert isinstance(rows, list) and rows
        if args[0] == "decide":
            assert {"b_star", "u_star", "n_half_bytes"} <= rows[0].keys()
    else:
        header = r.stdout.splitlines()[0]
        assert "," in header and "│" not in r.stdout


def test_decide_fits_80_columns_without_cutting_digits(xbench, tmp_path):
    r = xbench(
        "decide",
        "--payload",
        "1KB",
        "--rows",
        "1,64",
        "--chunk",
        "1024,16384",
        "--reuse",
        "0,100",
        "--out",
        tmp_path / "d.parquet",
        env={"COLUMNS": "80"},
    )
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    # a five-digit local time (16K tokens recomputed), whole
    from xbench.core.profile import load_profile
    from xbench.resources import profile_path

    device = load_profile(profile_path("h100-priors")).device
    local_us = (device.recompute(16384) + device.compute(16, 16384)) * 1e6
    whole = [float(t.replace(",", "")) for t in r.stdout.split() if re.fullmatch(r"\d\d,\d{3}", t)]
    assert local_us >= 10_000 and any(abs(v / local_us - 1) < 1e-3 for v in whole), whole


def test_shell_completion_is_offered(xbench):
    r = xbench("--help")
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout
