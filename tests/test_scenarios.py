"""Scenario files: the shipped ones run; malformed ones are one-line errors."""

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

SHIPPED = sorted(Path("scenarios").glob("*.toml"))


PREFILL = [p for p in SHIPPED if 'kind = "prefill"' in p.read_text()]
DECODE = [p for p in SHIPPED if p not in PREFILL]


@pytest.mark.parametrize("path", DECODE, ids=[p.stem for p in DECODE])
def test_shipped_scenarios_decide(xbench, tmp_path, path):
    r = xbench("decide", "--scenario", path, "--out", tmp_path / "d.parquet", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows and {row["decision"] for row in rows} <= {"route", "fetch", "local"}


def test_decide_refuses_a_prefill_scenario_and_names_simulate(xbench, tmp_path):
    """A prefill workload asks where to prefill, not where a decode query attends."""
    assert [p.stem for p in PREFILL] == ["prefill-as-a-service"]
    out = tmp_path / "d.parquet"
    r = xbench("decide", "--scenario", "prefill-as-a-service", "--out", out)
    assert r.returncode == 2 and "Traceback" not in r.stderr and not out.exists()
    line = r.stderr.strip().splitlines()[-1]
    assert "is a prefill workload" in line and "xbench simulate" in line, r.stderr


def test_span_query_reuse_flips_route_to_fetch(xbench, tmp_path):
    r = xbench(
        "decide",
        "--scenario",
        "scenarios/span-fanout.toml",
        "--out",
        tmp_path / "d.parquet",
        "--format",
        "json",
    )
    rows = [row for row in json.loads(r.stdout) if row["rows"] == 8 and row["chunk_tokens"] == 2048]
    by_reuse = {row["reuse"]: row["decision"] for row in rows}
    assert by_reuse[0] == "route" and by_reuse[1024] == "fetch"


@pytest.mark.parametrize(
    "text, words",
    [
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[grid]\nrows = [1]\ncolour = "red"\n',
            "unknown keys",
        ),
        ('[scenario]\nmodel = "deepseek-v3"\n', "no [scenario] name"),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[grid]\nrows = "many"\n',
            "list of non-negative integers",
        ),
        ('[scenario]\nname = "x"\n', "neither model nor payload"),
        ('[scenario]\nname = "x"\n[request]\npayload = "1KX"\n', "bad size '1KX'"),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[grid]\nfabric = ["warp"]\n',
            "asks for fabric warp",
        ),
        ("[scenario\n", "not valid TOML"),
        # these were a traceback, or taken as something else (probe = "no" as true, 2.7 as 2)
        ('[scenario]\nname = "x"\nmodel = 7\n', "[scenario] model = 7 has the wrong type"),
        ('[scenario]\nname = 5\nmodel = "deepseek-v3"\n', "name = 5 has the wrong type"),
        ('[scenario]\nname = "x"\nmodel = "deepseek-v3"\ncolour = 1\n', "unknown [scenario]"),
        ("scenario = 5\n", "scenario = 5 is not a table"),
        ('grid = [1]\n[scenario]\nname = "x"\n', "grid = [1] is not a table"),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[request]\nheads = 2.7\n',
            "heads = 2.7 has the wrong type; give heads as a whole number",
        ),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[request]\nprobe = "no"\n',
            "give probe as true or false",
        ),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[request]\nsegments = 0\n',
            "segments = 0 is out of range",
        ),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[request]\nheads = 2199023255552\n',
            "heads = 2199023255552 is beyond any request; keep heads at or below 1099511627776",
        ),
        # an empty fabric list decided nothing, wrote an empty table and exited 0
        ('[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[grid]\nfabric = []\n', "names no fabric"),
        (
            '[scenario]\nname = "x"\nmodel = "deepseek-v3"\n[grid]\nfabric = [3]\n',
            "fabric = [3] is not a list of fabric names",
        ),
    ],
)
def test_malformed_scenarios_are_one_line_errors(xbench, tmp_path, text, words):
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    r = xbench("decide", "--scenario", bad, "--out", tmp_path / "d.parquet")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert words in r.stderr.strip().splitlines()[-1], r.stderr
