import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from xbench.errors import XbenchError
from xbench.results import schema
from xbench.results.store import RunStore, read_run_meta, read_table, write_table

pytestmark = pytest.mark.nompi  # starts no MPI (conftest: the Open MPI run skips it)


def _rows(n=3, **over):
    base = dict(
        run_id="r1",
        process_run=0,
        pattern="latency",
        transport="mpi",
        device="host",
        fabric="shm",
        fabric_inferred=True,
        loop="c",
        rank_a=0,
        rank_b=1,
        host_a="h",
        host_b="h",
        pair_class="intra-node",
        size_bytes=8,
        rows=None,
        return_bytes=None,
        window=None,
        blocks=None,
        block_bytes=None,
        iterations=100,
        warmup=False,
        metric="latency_oneway",
        unit="us",
    )
    return [{**base, "sample": i, "value": 1.0 + i, **over} for i in range(n)]


def test_round_trip_keeps_rows_types_and_metadata(tmp_path):
    store = RunStore(tmp_path / "run", {"run_id": "r1", "hosts": ["h"]})
    store.append(schema.PROBE_SAMPLES, _rows())
    store.append(
        schema.PROBE_SAMPLES,
        _rows(
            2,
            size_bytes=1024,
            window=64,
            pattern="bandwidth",
            metric="bandwidth_window",
            unit="MB/s",
        ),
    )
    frame = read_table(tmp_path / "run", schema.PROBE_SAMPLES)
    assert len(frame) == 5
    assert list(frame.columns) == schema.PROBE_SAMPLES_SCHEMA.names
    assert frame["size_bytes"].tolist() == [8, 8, 8, 1024, 1024]
    assert frame["window"].isna().sum() == 3
    part = next((tmp_path / "run" / schema.PROBE_SAMPLES).glob("part-*.parquet"))
    meta = pq.read_schema(part).metadata
    assert meta[b"xbench.table"] == b"probe_samples"
    assert int(meta[b"xbench.schema_version"]) == schema.SCHEMA_VERSIONS["probe_samples"]
    assert json.loads(meta[b"xbench.run"])["run_id"] == "r1"
    assert read_run_meta(tmp_path / "run")["hosts"] == ["h"]


def test_one_directory_holds_one_run(tmp_path):
    RunStore(tmp_path / "run", {"run_id": "r1"})
    with pytest.raises(XbenchError, match="already holds run r1"):
        RunStore(tmp_path / "run", {"run_id": "r2"})


def test_unwritable_directory_is_a_one_line_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(XbenchError, match="cannot write results"):
        RunStore(blocker / "sub", {"run_id": "r"})
    for path in (blocker, Path("/dev/null")):  # mkdir says "File exists"
        with pytest.raises(XbenchError, match=r"\(a file, not a directory\)"):
            RunStore(path, {"run_id": "r"})


def test_newer_schema_and_wrong_table_are_refused(tmp_path):
    path = write_table(tmp_path / "a.parquet", schema.PROBE_SAMPLES, _rows(), {"run_id": "r1"})
    with pytest.raises(XbenchError, match="not 'kernel_samples'"):
        read_table(path, schema.KERNEL_SAMPLES)
    table = pq.read_table(path)
    meta = dict(table.schema.metadata)
    meta[b"xbench.schema_version"] = b"99"
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "b.parquet")
    with pytest.raises(XbenchError, match="newer than this xbench"):
        read_table(tmp_path / "b.parquet", schema.PROBE_SAMPLES)


def _as_version(path, version: int, out, added_since=("process_run",)):
    """Rewrite a current file as an older version, without the columns added after it."""
    table = pq.read_table(path)
    if added_since:
        table = table.drop_columns(list(added_since))
    pq.write_table(
        table.replace_schema_metadata(
            {**table.schema.metadata, b"xbench.schema_version": str(version).encode()}
        ),
        out,
    )
    return out


def test_v1_files_migrate_to_v2(tmp_path):
    path = write_table(tmp_path / "a.parquet", schema.PROBE_SAMPLES, _rows(), {"run_id": "r1"})
    old = _as_version(path, 1, tmp_path / "v1.parquet")
    assert "process_run" not in pq.read_schema(old).names
    frame = read_table([old, path], schema.PROBE_SAMPLES)  # old and new files read together
    assert list(frame.columns) == schema.PROBE_SAMPLES_SCHEMA.names
    assert frame.process_run.tolist() == [0] * 6


def test_validate_v1_files_read_as_rank_0_asking_in_one_pass(tmp_path):
    row = dict(
        run_id="v",
        option="route",
        transport="mpi",
        fabric="shm",
        rows=1,
        heads=16,
        chunk_tokens=256,
        dtype="bf16",
        iterations=10,
        sample=0,
        warmup=False,
        metric="time",
        value=300.0,
        unit="us",
        max_abs_error=1e-4,
        correct=True,
        requester=1,
        round=2,
        segments=4,
        process_run=1,
        send_us=20.0,
        attention_us=200.0,
        return_us=30.0,
        merge_us=50.0,
    )
    path = write_table(tmp_path / "v.parquet", schema.VALIDATE_SAMPLES, [row], {"run_id": "v"})
    v4 = (
        "process_run",
        *(f"{p}_us" for p in ("send", "attention", "return", "merge", "transfer", "move")),
    )
    old = _as_version(path, 1, tmp_path / "v1.parquet", ("requester", "round", "segments", *v4))
    v2 = _as_version(path, 2, tmp_path / "v2.parquet", ("segments", *v4))
    v3 = _as_version(path, 3, tmp_path / "v3.parquet", v4)
    frame = read_table([old, v2, v3, path], schema.VALIDATE_SAMPLES)
    assert list(frame.columns) == schema.VALIDATE_SAMPLES_SCHEMA.names
    assert frame.requester.tolist() == [0, 1, 1, 1] and frame["round"].tolist() == [0, 2, 2, 2]
    assert frame.segments.tolist() == [1, 1, 4, 4]  # before v3 a fetch was one packed message
    assert frame.process_run.tolist() == [0, 0, 0, 1]  # before v4 one launch, no phases
    assert frame.send_us.isna().tolist() == [True, True, True, False]


def test_kernel_v1_files_read_as_one_pass(tmp_path):
    row = dict(
        run_id="k",
        kernel="merge",
        backend="torch",
        device="cpu",
        model="m",
        dtype="bf16",
        rows=1,
        heads=16,
        chunk_tokens=0,
        sparse=False,
        partials=2,
        bytes_moved=1,
        flops=1,
        iterations=10,
        sample=0,
        warmup=False,
        metric="time",
        value=11.8,
        unit="us",
        round=1,
        process_run=2,
        timed_by=1,
        after_tokens=1024,
        idle_us=4000,
        wait_us=2000,
        after_splice_tokens=512,
        launch="graph",
        plan="tile 64x64 w8 s2 p1, 66 splits",
    )
    path = write_table(tmp_path / "k.parquet", schema.KERNEL_SAMPLES, [row], {"run_id": "k"})
    v3 = ("process_run", "timed_by", "after_tokens", "idle_us", "wait_us", "after_splice_tokens")
    v7 = ("launch", "plan")
    old = _as_version(path, 1, tmp_path / "v1.parquet", ("round", *v3, *v7))
    v2 = _as_version(path, 2, tmp_path / "v2.parquet", (*v3, *v7))
    v3_file = _as_version(path, 3, tmp_path / "v3.parquet", (*v3[3:], *v7))
    v4 = _as_version(path, 4, tmp_path / "v4.parquet", (*v3[4:], *v7))
    v5 = _as_version(path, 5, tmp_path / "v5.parquet", (*v3[5:], *v7))
    v6 = _as_version(path, 6, tmp_path / "v6.parquet", v7)
    frame = read_table([old, v2, v3_file, v4, v5, v6, path], schema.KERNEL_SAMPLES)
    assert frame["round"].tolist() == [0, 1, 1, 1, 1, 1, 1]
    assert frame.process_run.tolist() == [0, 0, 2, 2, 2, 2, 2]
    assert frame.timed_by.tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert frame.after_tokens.tolist() == [0, 0] + [1024] * 5  # v1-2: back to back
    assert frame.idle_us.tolist() == [0, 0, 0] + [4000] * 4  # before v4 nothing after idle
    assert frame.wait_us.tolist() == [0, 0, 0, 0] + [2000] * 3  # before v5 nothing after a wait
    # before v6 no attention after a splice
    assert frame.after_splice_tokens.tolist() == [0, 0, 0, 0, 0, 512, 512]
    # before v7 neither the launch nor the backend's choice was recorded
    assert frame.launch.tolist() == [""] * 6 + ["graph"]
    assert frame.plan.tolist() == [""] * 6 + ["tile 64x64 w8 s2 p1, 66 splits"]


def test_migrations_chain_from_older_versions(tmp_path, monkeypatch):
    path = write_table(tmp_path / "a.parquet", schema.PROBE_SAMPLES, _rows(), {"run_id": "r1"})
    old = _as_version(path, 0, tmp_path / "v0.parquet")
    calls = []
    monkeypatch.setitem(schema.MIGRATIONS[schema.PROBE_SAMPLES], 0, lambda t: calls.append(0) or t)
    frame = read_table(old, schema.PROBE_SAMPLES)
    assert calls == [0] and len(frame) == 3 and frame.process_run.eq(0).all()


def test_missing_results_path(tmp_path):
    with pytest.raises(XbenchError, match="does not exist"):
        read_table(tmp_path / "nope", schema.PROBE_SAMPLES)
    assert isinstance(read_table(tmp_path, schema.PROBE_SAMPLES), pd.DataFrame)


SIM_STATS = ("p50_us", "p99_us", "mean_us", "throughput_per_s")
FLOORS = tuple(f"floor_{stat}" for stat in SIM_STATS)  # v3
INTERVALS = (  # v5
    *(f"error_{end}_{stat}" for stat in SIM_STATS for end in ("low", "high")),
    "error_coverage",
)


def _simulation_validation_row(costs: str, replays: int) -> dict:
    row = {"policy": "route", "costs": costs, "requests": 10, "rate_per_s": 5.0}
    kinds = ("simulated", "measured", "error", "floor")
    row.update({f"{kind}_{stat}": 1.0 for stat in SIM_STATS for kind in kinds})
    central = "median" if replays > 1 else "one"
    return {**row, "routed_instead": 0, "replays": replays, "central": central}


def test_simulation_validation_v1_files_read_as_the_profiles_costs(tmp_path):
    table = schema.SIMULATION_VALIDATION
    row = _simulation_validation_row("calibrated", 1)
    path = write_table(tmp_path / "v.parquet", table, [row], {"run_id": "v"})
    old = _as_version(
        path, 1, tmp_path / "v1.parquet", ("costs", "replays", *FLOORS, "central", *INTERVALS)
    )
    assert read_table([old, path], table).costs.tolist() == ["profile", "calibrated"]


def test_simulation_validation_v2_files_read_as_one_replay_without_a_floor(tmp_path):
    table = schema.SIMULATION_VALIDATION
    path = write_table(
        tmp_path / "v.parquet", table, [_simulation_validation_row("profile", 3)], {"run_id": "v"}
    )
    old = _as_version(path, 2, tmp_path / "v2.parquet", ("replays", *FLOORS, "central", *INTERVALS))
    frame = read_table([old, path], table)
    assert frame.replays.tolist() == [1, 3]
    assert frame.floor_p99_us.isna().tolist() == [True, False]


def test_simulation_validation_v3_files_read_as_the_first_replay_compared(tmp_path):
    table = schema.SIMULATION_VALIDATION
    rows = [_simulation_validation_row("profile", n) for n in (1, 3)]
    path = write_table(tmp_path / "v.parquet", table, rows, {"run_id": "v"})
    old = _as_version(path, 3, tmp_path / "v3.parquet", ("central", *INTERVALS))
    frame = read_table([old, path], table)
    assert frame.central.tolist() == ["one", "first", "one", "median"]


def test_simulation_validation_v4_files_read_without_an_errors_interval(tmp_path):
    table = schema.SIMULATION_VALIDATION
    row = {**_simulation_validation_row("profile", 3), "error_low_p50_us": -0.1}
    row.update(error_high_p50_us=0.2, error_coverage=0.95)
    path = write_table(tmp_path / "v.parquet", table, [row], {"run_id": "v"})
    old = _as_version(path, 4, tmp_path / "v4.parquet", INTERVALS)
    frame = read_table([old, path], table)
    assert frame.error_low_p50_us.tolist()[1] == -0.1 and frame.error_coverage.tolist()[1] == 0.95
    assert frame[list(INTERVALS)].iloc[0].isna().all()  # v4 said nothing of it


def test_comparison_v1_files_read_without_a_detectable_change(tmp_path):
    row = {"case": "latency 8B", "case_key": "k", "unit": "us", "verdict": "unchanged"}
    row.update(n_baseline=3, n_candidate=3, launches_baseline=3, launches_candidate=3)
    row.update(launch_sd=0.05, detectable=0.12)
    table = schema.COMPARISON
    path = write_table(tmp_path / "c.parquet", table, [row], {"run_id": "c"})
    old = _as_version(path, 1, tmp_path / "c1.parquet", ("launch_sd", "detectable"))
    frame = read_table([old, path], table)
    assert frame.detectable.isna().tolist() == [True, False] and frame.launch_sd.iloc[1] == 0.05


@pytest.mark.parametrize("finished", [False, True])
def test_a_signal_marks_a_run_partial_unless_it_finished(tmp_path, finished):
    """A run that finished keeps its status when a signal arrives later (while its summary
    prints), and the line says it is whole; one still running is marked partial."""
    from xbench.results.stopping import mark_stopped

    run = tmp_path / "run"
    store = RunStore(run, {"run_id": "probe-signal", "command": "probe"})
    if finished:
        store.finish()
    line = mark_stopped("interrupted", run)
    meta = read_run_meta(run)
    if finished:
        assert line == f"interrupted after the run finished; it is whole in {run}"
        assert meta["status"] == "complete" and "stopped_because" not in meta, meta
    else:
        assert line.startswith(f"interrupted; the cases finished so far are in {run} ")
        assert meta["status"] == "partial" and meta["stopped_because"] == "interrupted", meta
    assert mark_stopped("terminated", None) == "terminated before anything was written"
    claimed = tmp_path / "claimed"  # claimed, and its ranks not started: no run.json yet
    claimed.mkdir()
    assert mark_stopped("terminated", claimed) == "terminated before anything was written"


def test_a_signal_on_a_full_disk_says_run_json_still_says_running(full_disk):
    """Where run.json cannot be rewritten, the line does not claim it marks the run."""
    from conftest import fill

    from xbench.results.stopping import mark_stopped

    run = full_disk / "run"
    RunStore(run, {"run_id": "probe-full", "command": "probe"})
    fill(full_disk)
    line = mark_stopped("terminated", run)
    assert "run.json could not be rewritten and still says running" in line, line
    assert read_run_meta(run)["status"] == "running"


def _span_hit_rows():
    return [
        dict(
            expr="a",
            tokens=16,
            hit_tokens_dependent=0,
            hit_rate_dependent=0.0,
            ttft_dependent_s=ttft,
            hit_tokens_independent=0,
            hit_rate_independent=0.0,
            ttft_independent_s=ttft,
            prefill_layers=61 if ttft else None,
            prefill_gpus=8 if ttft else None,
            request=i,
            output="a1" if i else "",
            **{name: ttft for name in schema.SPAN_TTFT_TERMS},
            ttft_ratio=1.0 if ttft else None,
        )
        for i, ttft in enumerate((1e-3, None))
    ]


V3_SPAN_COLUMNS = ("request", "output", *schema.SPAN_TTFT_TERMS, "ttft_ratio")


def test_span_hits_v1_files_read_as_one_layer_on_one_gpu(tmp_path):
    """span_hits v1 priced its TTFT as one layer's prefill on one GPU: it says so."""
    rows = _span_hit_rows()
    path = write_table(tmp_path / "h.parquet", schema.SPAN_HITS, rows, {"run_id": "s"})
    old = _as_version(
        path, 1, tmp_path / "v1.parquet", ("prefill_layers", "prefill_gpus", *V3_SPAN_COLUMNS)
    )
    frame = read_table([old], schema.SPAN_HITS)
    assert list(frame.columns) == schema.SPAN_HITS_SCHEMA.names
    assert frame.prefill_layers.tolist()[0] == 1 and frame.prefill_gpus.tolist()[0] == 1
    assert frame.prefill_layers.isna().tolist() == [False, True]


def test_span_hits_v2_files_read_as_one_data_call_per_expression(tmp_path):
    """span_hits v3 made a row a call: a v2 row was an expression's one data-only call."""
    path = write_table(tmp_path / "h.parquet", schema.SPAN_HITS, _span_hit_rows(), {"run_id": "s"})
    old = _as_version(path, 2, tmp_path / "v2.parquet", V3_SPAN_COLUMNS)
    frame = read_table([old, path], schema.SPAN_HITS)
    assert list(frame.columns) == schema.SPAN_HITS_SCHEMA.names
    assert frame.request.tolist() == [0, 1, 0, 1] and frame.output.tolist() == ["", "", "", "a1"]
    assert frame.ttft_ratio.isna().tolist() == [True, True, False, True]
    assert frame[schema.SPAN_TTFT_TERMS].iloc[:2].isna().all().all()


def test_simulation_v1_files_read_without_the_rates(tmp_path):
    """simulation v2 added offered_per_s and sustainable_per_s: v1 files read them null."""
    row = {f.name: 0.0 for f in schema.SIMULATION_SCHEMA}
    row.update(fabric="ib", policy="route", requests=1, batches=1)
    path = write_table(tmp_path / "s.parquet", schema.SIMULATION, [row], {"run_id": "s"})
    old = _as_version(path, 1, tmp_path / "v1.parquet", ("offered_per_s", "sustainable_per_s"))
    frame = read_table([old], schema.SIMULATION)
    assert list(frame.columns) == schema.SIMULATION_SCHEMA.names
    assert frame.offered_per_s.isna().all() and frame.sustainable_per_s.isna().all()


def test_sharing_steps_v1_files_read_without_gpus(tmp_path):
    """sharing_steps v2 placed a step on GPUs: v1 files read those columns null."""
    row = {f.name: 1 for f in schema.SHARING_STEPS_SCHEMA}
    path = write_table(tmp_path / "s.parquet", schema.SHARING_STEPS, [row], {"run_id": "s"})
    old = _as_version(path, 1, tmp_path / "v1.parquet", schema.SHARING_GPU_COLUMNS)
    frame = read_table([old, path], schema.SHARING_STEPS)
    assert list(frame.columns) == schema.SHARING_STEPS_SCHEMA.names
    assert frame[schema.SHARING_GPU_COLUMNS].iloc[0].isna().all()
    assert (frame[schema.SHARING_GPU_COLUMNS].iloc[1] == 1).all()


def _saturation_row() -> dict:
    row = {f.name: 0.5 for f in schema.PREFILL_SATURATION_SCHEMA}
    row.update(fabric="tcp", deployment="homogeneous", policy="local")
    row.update(prefill_instances=5, decode_instances=3, decode_batch_bound="memory")
    row.update(output_tokens=1024)
    return row


def test_prefill_saturation_v1_files_read_without_the_same_gpus_comparison(tmp_path):
    path = write_table(
        tmp_path / "p.parquet", schema.PREFILL_SATURATION, [_saturation_row()], {"run_id": "p"}
    )
    dropped = ("vs_same_gpus", *schema.SATURATION_DECODE_COLUMNS, "output_tokens")
    old = _as_version(path, 1, tmp_path / "v1.parquet", dropped)
    frame = read_table([old, path], schema.PREFILL_SATURATION)
    assert list(frame.columns) == schema.PREFILL_SATURATION_SCHEMA.names
    assert frame.vs_same_gpus.isna().tolist() == [True, False]


def test_prefill_saturation_v2_files_read_without_decode(tmp_path):
    """v3 split this cluster's instances between prefill and decode: v2 files, which
    simulated no decode, read the split and the decode figures null."""
    assert schema.SATURATION_DECODE_COLUMNS[0] == "prefill_instances"
    path = write_table(
        tmp_path / "p.parquet", schema.PREFILL_SATURATION, [_saturation_row()], {"run_id": "p"}
    )
    dropped = (*schema.SATURATION_DECODE_COLUMNS, "output_tokens")
    old = _as_version(path, 2, tmp_path / "v2.parquet", dropped)
    frame = read_table([old, path], schema.PREFILL_SATURATION)
    assert list(frame.columns) == schema.PREFILL_SATURATION_SCHEMA.names
    decode = frame[list(dropped)]
    assert decode.iloc[0].isna().all() and decode.iloc[1].notna().all()
    assert frame.decode_instances.iloc[1] == 3 and frame.vs_same_gpus.notna().all()


def test_prefill_saturation_v3_files_read_without_their_output_tokens(tmp_path):
    path = write_table(
        tmp_path / "p.parquet", schema.PREFILL_SATURATION, [_saturation_row()], {"run_id": "p"}
    )
    old = _as_version(path, 3, tmp_path / "v3.parquet", ("output_tokens",))
    frame = read_table([old, path], schema.PREFILL_SATURATION)
    assert list(frame.columns) == schema.PREFILL_SATURATION_SCHEMA.names
    assert frame.output_tokens.isna().tolist() == [True, False]
    assert frame.decode_instances.tolist() == [3, 3]
