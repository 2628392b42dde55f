"""The one record of a decode step's parts (``core.parts``): its parts add up to decide's
option times on every profile, the simulator prices an idle use as decide does, the
prefill is the whole model's, and no module outside ``core`` composes coefficients."""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xbench.core.costmodel import HIGH, LOW, SCALAR, VALUE, Coef, Request, decide, times, wire_costs
from xbench.core.parts import fabric_parts, prefill_time, step_parts
from xbench.core.profile import load_profile
from xbench.core.scenario import load_workload
from xbench.resources import profile_path

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _waited(profile):
    """A profile with the merge-wait terms too (none shipped has them)."""
    return replace(
        profile,
        device=replace(
            profile.device,
            merge_wait_t0=Coef(3e-5, 2e-5, 4e-5, "s"),
            merge_wait_per_row_partial=Coef(1e-9, 5e-10, 2e-9, "s/row-partial"),
            merge_wait_tau=Coef(2e-4, 1e-4, 3e-4, "s"),
        ),
    )


PROFILES = {
    "h100-priors": load_profile(profile_path("h100-priors")),
    "h200": load_profile(ROOT / "profiles" / "h200.toml"),
    "vm-cpu": load_profile(DATA / "vm-cpu-profile.toml"),
    "engine-fixture": load_profile(DATA / "engine-fixture.toml"),
}
PROFILES["vm-cpu-waits"] = _waited(PROFILES["vm-cpu"])

requests = st.builds(
    Request,
    rows=st.integers(1, 256),
    heads=st.sampled_from([1, 16, 128]),
    chunk_tokens=st.integers(1, 1 << 20),
    reuse=st.sampled_from([0, 1, 7, 1000]),
    segments=st.sampled_from([1, 4, 64]),
    fetch_cost=st.sampled_from([None, 3e-3]),
    include_probe=st.booleans(),
    blocks_local=st.booleans(),
    layers=st.sampled_from([1, 2, 61]),
    holders=st.sampled_from([1, 2, 4]),
    pipeline_layers=st.booleans(),
    payload_bytes=st.sampled_from([576, 1152]),
    return_bytes=st.sampled_from([516, 1028]),
    kv_bytes_per_token=st.sampled_from([656, 1152]),
    probe_bytes=st.just(64),
    fabric=st.none(),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PROFILES)), r=requests, end=st.sampled_from([VALUE, LOW, HIGH]))
def test_the_parts_add_up_to_decides_times_on_every_profile_and_fabric(name, r, end):
    profile = PROFILES[name]
    for fabric in profile.fabrics:
        parts = fabric_parts(fabric, profile.device, r, end)
        # the record's totals are decide's, exactly
        assert (parts.route, parts.fetch, parts.local) == times(fabric, profile.device, r, end)
        # and its phases add up to them (to the last bits of a sum in another order)
        for option, total in (("route", parts.route), ("fetch", parts.fetch)):
            assert sum(parts.phases()[option].values()) == pytest.approx(total, rel=1e-12)
        if parts.local < math.inf:
            assert sum(parts.phases()["local"].values()) == pytest.approx(parts.local, rel=1e-12)
        # the legs, each split into occupancy and flight, are the wire the formulas price
        route_wire, fetch_wire, _ = wire_costs(
            SCALAR, fabric.breaks, fabric.terms(end),
            r.rows * r.heads * r.payload_bytes, r.rows * r.heads * r.return_bytes,
            r.chunk_tokens * r.kv_bytes_per_token, r.segments, r.layers, r.holders,
        )  # fmt: skip
        assert parts.query_link + parts.answer_link == pytest.approx(route_wire, rel=1e-12)
        assert parts.kv_link == pytest.approx(fetch_wire, rel=1e-12)
    if end == VALUE:
        d = decide(profile, replace_fabric(r, profile.fabrics[0].name))
        parts = step_parts(profile, replace_fabric(r, profile.fabrics[0].name))
        assert (d.t_route, d.t_fetch, d.t_local) == pytest.approx(
            (parts.route, parts.fetch, parts.local), rel=1e-12
        )


def replace_fabric(r: Request, fabric: str) -> Request:
    return r._replace(fabric=fabric)


def _shipped_decode_runs():
    """(path, workload, profile name, profile) for every shipped decode scenario on both
    shipped profiles."""
    for path in sorted((ROOT / "scenarios").glob("*.toml")):
        spec = load_workload(path)
        if spec["kind"] == "decode":
            for name in ("h100-priors", "h200"):
                yield path, spec, name, PROFILES[name]


def test_the_simulator_prices_an_idle_use_as_decide_on_every_shipped_scenario():
    """The engine's costs are the record's: a use on idle resources costs what decide says,
    on every shipped decode scenario, fabric and shipped profile, over 1 and 61 layers."""
    from xbench.simulate import Workload
    from xbench.simulate.engine import _Costs

    for path, spec, name, profile in _shipped_decode_runs():
        for fabric in spec["fabrics"]:
            if fabric not in {f.name for f in profile.fabrics}:
                continue
            for layers in (1, 61):
                w = Workload(**{**spec["fields"], "layers": layers}, fabric=fabric)
                d = decide(profile, w.request())
                costs = _Costs(profile, w).per_use()
                got = (costs["route"], costs["fetch"], costs["local"])
                assert got == (d.t_route, d.t_fetch, d.t_local), (path.name, name, fabric, layers)


def test_a_prefill_is_every_layer_over_the_gpus():
    device = PROFILES["h100-priors"].device
    one = prefill_time(device, 8192)
    assert one == device.recompute(8192)
    assert prefill_time(device, 8192, layers=61, gpus=8) == pytest.approx(61 * one / 8)
    # after a cached context, the new tokens attend it: more than alone, less than all
    after = prefill_time(device, 4096, context=4096, layers=61)
    assert prefill_time(device, 4096, layers=61) < after < prefill_time(device, 8192, layers=61)


def test_span_ttft_is_the_whole_models_prefill_and_follows_layers():
    """span-fanout's TTFT prefills every layer of its model (61) over the instance's GPUs
    (128 heads over the request's 16: 8), and --layers sets the layers it prices."""
    from xbench.simulate import span_hit_rates

    profile = PROFILES["h100-priors"]
    spec = load_workload(ROOT / "scenarios" / "span-fanout.toml")
    hits = span_hit_rates(profile, spec)
    first = hits.iloc[0]
    assert (first.prefill_layers, first.prefill_gpus) == (61, 8)
    assert first.ttft_dependent_s == pytest.approx(
        61 * profile.device.recompute(first.tokens) / 8, rel=1e-12
    )
    two = {**spec, "fields": {**spec["fields"], "layers": 2}}
    assert span_hit_rates(profile, two).iloc[0].ttft_dependent_s == pytest.approx(
        first.ttft_dependent_s * 2 / 61, rel=1e-12
    )


# The names of coefficients: a device's terms and a fabric's. Reading one's value (or a
# profile's raw terms) to compute a time is the cost model's work, done in core alone.
def _coefficient_names() -> set[str]:
    from xbench.core import device_terms

    return {t.name for t in device_terms.TERMS} | {
        "overhead", "alpha", "beta", "block_t0", "block_beta",
    }  # fmt: skip


# Where reading coefficients is the module's job: core (the model), fit and the
# simulator's calibration (which make them: a calibration scales a profile's terms to what
# a replay measured), and cli (which prints them).
MAY_READ_COEFFICIENTS = (
    "xbench/core/",
    "xbench/fit/",
    "xbench/simulate/calibration.py",
    "xbench/cli/",
)


def test_no_module_outside_core_composes_coefficients():
    """Outside core, fit and cli, no module reads a coefficient's value or a profile's raw
    terms (``.terms(``): costs come from core's record and formulas."""
    names = _coefficient_names()
    bad = []
    for path in sorted((ROOT / "xbench").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(MAY_READ_COEFFICIENTS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            if (
                node.attr in ("value", "low", "high")
                and isinstance(node.value, ast.Attribute)
                and node.value.attr in names
            ) or node.attr == "terms":
                bad.append(f"{rel}:{node.lineno}: .{getattr(node.value, 'attr', '?')}.{node.attr}")
    assert not bad, "\n".join(bad)


def test_decide_and_simulate_give_one_answer_on_every_shipped_scenario_or_the_cause():
    """On every shipped decode scenario and fabric, on both shipped profiles: decide's
    answer at the uses a fetch served in the simulation is the better static policy, or
    always-route kept a resource busy enough to be the cause (the line printed says so)."""
    from xbench.simulate import BUSY, decide_beside, run

    for path, spec, name, profile in _shipped_decode_runs():
        frame = run(profile, spec, ["route", "fetch"], 2000, 0)
        for r in decide_beside(profile, spec, frame).itertuples():
            agree = r.decide_at_uses == r.better_static
            assert agree or r.route_busy >= BUSY, (path.stem, name, r)


def test_a_saturated_run_says_so_in_one_line_with_the_rate_sustained():
    """--layers 61 multiplies each use's cost, not the scenario's rate: the README's 61-layer
    step saturates at the scenario's rate and says so with what it sustains; at a rate
    below that, route and fetch keep up and nothing is said of them."""
    from xbench.simulate import run, saturated_line

    spec = load_workload(ROOT / "scenarios" / "decode-route-vs-fetch.toml")
    spec = {**spec, "fabrics": ["nvlink"]}
    step = {**spec, "fields": {**spec["fields"], "layers": 61, "holders": 4}}
    frame = run(PROFILES["h100-priors"], step, ["route", "fetch"], 2000, 0)
    line = saturated_line(frame)
    assert line is not None and "\n" not in line and "saturated: 2 of 2 runs" in line
    sustained = frame.sustainable_per_s.max()
    assert sustained < frame.offered_per_s.min() / 2
    slower = {**step, "fields": {**step["fields"], "rate_per_s": sustained / 4}}
    assert saturated_line(run(PROFILES["h100-priors"], slower, ["route", "fetch"], 2000, 0)) is None
    # one layer at the scenario's rate: route and fetch keep up on nvlink
    assert saturated_line(run(PROFILES["h100-priors"], spec, ["route", "fetch"], 2000, 0)) is None
