"""Versioned Arrow schemas of everything xbench writes.

Every Parquet file carries ``xbench.table`` and ``xbench.schema_version`` in its schema
metadata, plus the run metadata as JSON under ``xbench.run``. Readers refuse files of an
unknown table and migrate older versions forward with ``MIGRATIONS``.

History
-------
probe_samples v1: first version. One row per sample (long format): a sample is
    ``iterations`` repetitions of the pattern timed as one, ``value`` is the per-iteration
    figure of ``metric`` in ``unit``. Warm-up samples are stored with ``warmup = true``.
    ``loop`` says which timed inner loop ran (``c`` or ``python``).
probe_samples v2: adds ``process_run``, the index of the launch of the ranks the sample
    came from (``xbench probe --runs N`` launches N process sets, as pyperf runs several
    processes); v1 files read as process_run 0.
kernel_samples v1: first version. One row per timed sample of a kernel on one device.
validate_samples v1: first version. One row per timed sample of a real route / fetch /
    local between two ranks, with the path's error against one-instance attention.
kernel_samples v2: adds ``round``, the pass over all cases the sample came from
    (``--rounds``: passes interleave the cases, so drift hits them alike); v1 reads as 0.
decisions v1: written by ``xbench decide`` outside the store, columns as the grid had them.
decisions v2: through the store with a fixed schema; adds the closed forms ``b_star``,
    ``u_star`` and ``n_half_bytes`` of each row's chosen fabric (v1 files are not migrated:
    re-run decide, which takes microseconds).
decisions v3: adds ``layers``, ``holders`` and ``pipeline_layers``, the step each row's
    times cover (L layers, the chunk on k holders, route's round trip once a step or once a
    layer), v2 rows reading as one layer on one holder, not pipelined; and the break-even
    points of the two porting coefficients on the chosen fabric, ``payload_star`` (routed
    bytes a row) and ``fetch_cost_star`` (a layer's move, s), null in v2 rows.
kernel_samples v3: adds ``process_run`` (``xbench kernel --runs N`` launches the sweep N
    times into one run) and ``timed_by``, the rank that timed the case (``--np 2`` runs it
    beside a peer waiting in MPI, cases alternating the rank), and ``after_tokens``, the
    tokens an attention read just before each timed call of a merge, gather or splice
    (``--in-context``: as a route or fetch runs them); v2 files read as 0, 0 and 0.
kernel_samples v7: adds ``launch`` (graph or eager: how the timed calls ran; a GPU's calls
    after idle, a wait, an attention or a splice were eager before, their twins graph
    replays) and ``plan`` (what the backend chose: the triton backend's tile, split count
    and combine); v6 files read as "" for both (not recorded).
validate_summary v2: adds, per phase, ``measured_<phase>_us`` and ``predicted_<phase>_us``
    (v1 files read with them null).
simulation v1: first version, written by ``xbench simulate --out``.
prefill_saturation v1, sharing_calls v1, sharing_steps v1, span_hits v1: first versions,
    the reports ``xbench simulate --out`` writes beside the policies' table (deployments at
    saturation; shared-KV batching's calls and steps, its bounds in the run metadata; span
    expressions' hit rates).
simulation v2: adds ``offered_per_s`` and ``sustainable_per_s``, the rate the trace offered
    and about the most the busiest resource keeps up with; v1 files read with them null.
span_hits v2: adds ``prefill_layers`` and ``prefill_gpus``, the prefill its time to first
    token prices: the whole model's layers over the instance's GPUs; v1 priced one layer on
    one GPU, and its files read as 1 and 1.
prefill_saturation v2: adds the deployment ``homogeneous, same GPUs`` (both clusters' GPU
    count, all of this cluster's kind) and ``vs_same_gpus``, each deployment's rate over its;
    v1 files read it null.
prefill_saturation v3: decode on this cluster (a workload's ``output_tokens``): adds the
    split of its instances each deployment runs (``prefill_instances``, ``decode_instances``),
    what the decode instances keep up with, and one decode instance at full batch (its batch
    and what bounds it, its step and the step's linear-layer and attention terms, requests a
    second); without decode every instance prefills and the decode figures are null; v2
    files read them all null. ``vs_homogeneous`` and ``vs_naive`` may be null (against a
    deployment that kept up with none).
prefill_saturation v4: adds ``output_tokens``, each request's (0: no decode); v3 files read
    it null.
sharing_steps v2: adds the step on GPUs (``core.sharing.on_gpus``): the KV bytes a token,
    a copy's bytes and GPUs, and per setup (``moska``, ``apart``: the unique KV on GPUs of
    its own, ``copies``) the GPUs, the share of their memory used, their compute utilisation
    and requests a second per GPU, with MoSKA's gains per GPU; v1 files read them null.
span_hits v3: a row per call (span expressions take ``gen(input -> output)`` calls): adds
    ``request`` and ``output``, the TTFTs' terms (``ttft_<cache>_<fixed|matmul|attention>_s``)
    and ``ttft_ratio``; a TTFT now prefills what missed after what hit in one call (v2
    subtracted the hits' prefill from the whole's, which dropped a call's fixed time). v2
    files read as one data-only call per expression (``output`` ""), their terms null.
prefill_simulation v2: adds ``hit_rate``, the share of prompt tokens found in the prefix
    cache of the cluster that prefilled them (0 without shared prefixes); v1 files read
    with it null (not recorded).
simulation_validation v2: adds ``costs``: each policy simulated with the profile's costs
    and with those a calibration replay measured (v1 files read as the profile's).
simulation_validation v3: adds ``replays`` and ``floor_*``: the validated trace replayed
    several times in a row, the first compared, the others' largest distance from it.
simulation_validation v4: adds ``central``: ``--replays N`` runs N rounds (a calibration
    replay, then the trace's) and compares medians over them ("median"; "one" for a single
    round); v3 files read as "first" (several replays) or "one".
simulation_validation v5: adds ``error_low_*``, ``error_high_*`` and ``error_coverage``:
    each error's interval over the paired rounds (Student's t on their log errors, 95 %
    nominal); v4 files read with them null.
comparison v1: first version, written by ``xbench compare --out`` and ``xbench check``.
validate_samples v3: adds ``segments``, the messages a fetch sent.
validate_samples v4: adds ``process_run`` (``xbench validate --runs N``) and the sample's
    mean time per phase (``send_us``, ``attention_us``, ``return_us``, ``merge_us`` for
    route; ``transfer_us``, ``move_us``, ``attention_us``, ``merge_us`` for fetch;
    ``attention_us`` for local); v3 files read as launch 0 with no phases.
validate_summary v1: first version, written by ``xbench validate`` through the store.
kernel_samples v4: adds ``idle_us``, the microseconds the device idled before each timed
    call (``xbench kernel --idle``: an attention as a server at moderate load starts it,
    caches and clocks gone cold); v3 files read as 0 (back to back).
kernel_samples v5: adds ``wait_us``, the microseconds the timing thread spun before each
    timed call (``xbench kernel --merge-wait``: a merge as a route's requester runs it, after
    polling MPI for the answer); v4 files read as 0 (back to back).
kernel_samples v6: adds ``after_splice_tokens``, the tokens a splice wrote into an
    attention's own pages just before each timed call (``--in-context``: as a fetch's first
    use attends the chunk it has just spliced); v5 files read as 0 (none).
validate_samples v2: adds ``requester``, the rank that asked (and timed) the sample (the
    ranks take turns), and ``round`` as in kernel_samples; v1 files read as 0 and 0.
"""

from __future__ import annotations

import pyarrow as pa

PROBE_SAMPLES = "probe_samples"
KERNEL_SAMPLES = "kernel_samples"

PROBE_SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field(
            "pattern", pa.string(), nullable=False
        ),  # latency, bandwidth, bibw, rtt, gather, overhead
        pa.field("transport", pa.string(), nullable=False),  # mpi, tcp, nccl, ...
        pa.field("device", pa.string(), nullable=False),  # host or cuda: where the buffers live
        pa.field(
            "fabric", pa.string(), nullable=False
        ),  # shm, nvlink, ib, ibgda, roce, tcp, unknown
        pa.field(
            "fabric_inferred", pa.bool_(), nullable=False
        ),  # label inferred, not given by the user
        pa.field("loop", pa.string(), nullable=False),  # c, python, or device (a GPU kernel)
        pa.field("rank_a", pa.int32(), nullable=False),  # initiator / requester / sender
        pa.field("rank_b", pa.int32(), nullable=False),  # responder / holder / receiver
        pa.field("host_a", pa.string(), nullable=False),
        pa.field("host_b", pa.string(), nullable=False),
        pa.field("pair_class", pa.string(), nullable=False),  # intra-node or inter-node
        pa.field(
            "size_bytes", pa.int64(), nullable=False
        ),  # bytes moved per message (rtt: b*P sent)
        pa.field("rows", pa.int32()),  # rtt: query rows per round trip
        pa.field("return_bytes", pa.int64()),  # rtt: bytes answered per round trip
        pa.field("window", pa.int32()),  # bandwidth/bibw: messages in flight
        pa.field("blocks", pa.int32()),  # gather: k blocks
        pa.field("block_bytes", pa.int64()),  # gather: s bytes per block
        pa.field("iterations", pa.int64(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),  # index within the case, warm-ups first
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),
        pa.field(
            "process_run", pa.int32(), nullable=False
        ),  # v2: which launch of the ranks (--runs)
    ]
)

KERNEL_SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field(
            "kernel", pa.string(), nullable=False
        ),  # partial_attention, merge, gather, splice, ceiling_*
        pa.field("backend", pa.string(), nullable=False),  # torch, cuda, flashmla, flashinfer
        pa.field("device", pa.string(), nullable=False),  # cpu, cuda:0 (name in run metadata)
        pa.field("model", pa.string(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("rows", pa.int32(), nullable=False),  # query rows (decode tokens)
        pa.field("heads", pa.int32(), nullable=False),
        pa.field("chunk_tokens", pa.int64(), nullable=False),  # tokens attended / moved
        pa.field("sparse", pa.bool_(), nullable=False),
        pa.field("partials", pa.int32(), nullable=False),  # merge: partial results combined
        pa.field("bytes_moved", pa.int64(), nullable=False),  # minimum bytes read + written
        pa.field("flops", pa.int64(), nullable=False),  # floating-point operations
        pa.field("iterations", pa.int64(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),  # time
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),  # v2: which pass over the cases
        pa.field("process_run", pa.int32(), nullable=False),  # v3: which launch (--runs)
        pa.field("timed_by", pa.int32(), nullable=False),  # v3: the rank that timed it (--np)
        # v3: tokens an attention read just before each timed call (0: back to back)
        pa.field("after_tokens", pa.int32(), nullable=False),
        # v4: microseconds idle before each timed call (0: back to back)
        pa.field("idle_us", pa.int32(), nullable=False),
        # v5: microseconds spent waiting (spinning) before each timed call (0: back to back)
        pa.field("wait_us", pa.int32(), nullable=False),
        # v6: tokens spliced into the attention's own pages before each timed call (0: none)
        pa.field("after_splice_tokens", pa.int32(), nullable=False),
        # v7: how the timed calls were launched (graph: CUDA graph replays; eager), and what
        # the backend chose for them (the triton backend: tile, splits, combine; "": nothing)
        pa.field("launch", pa.string(), nullable=False),
        pa.field("plan", pa.string(), nullable=False),
    ]
)

# The columns that name one case of each samples table (summaries group by them, compare
# matches runs by them).
PROBE_CASE_KEYS = [
    "pattern",
    "transport",
    "device",
    "fabric",
    "loop",
    "rank_a",
    "rank_b",
    "pair_class",
    "size_bytes",
    "rows",
    "return_bytes",
    "window",
    "blocks",
    "block_bytes",
    "metric",
    "unit",
]
KERNEL_CASE_KEYS = [
    "kernel",
    "backend",
    "device",
    "model",
    "dtype",
    "rows",
    "heads",
    "chunk_tokens",
    "after_tokens",
    "idle_us",
    "wait_us",
    "after_splice_tokens",
    "sparse",
    "partials",
    "bytes_moved",
    "flops",
]
VALIDATE_CASE_KEYS = [
    "option",
    "transport",
    "fabric",
    "rows",
    "heads",
    "chunk_tokens",
    "dtype",
    "segments",
]

VALIDATE_SAMPLES = "validate_samples"
VALIDATE_SAMPLES_SCHEMA = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("option", pa.string(), nullable=False),  # route, fetch, local
        pa.field("transport", pa.string(), nullable=False),
        pa.field("fabric", pa.string(), nullable=False),
        pa.field("rows", pa.int32(), nullable=False),  # decode tokens b
        pa.field("heads", pa.int32(), nullable=False),
        pa.field("chunk_tokens", pa.int64(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("iterations", pa.int64(), nullable=False),
        pa.field("sample", pa.int32(), nullable=False),
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
        pa.field("unit", pa.string(), nullable=False),
        pa.field("max_abs_error", pa.float64()),  # against one-instance attention
        pa.field("correct", pa.bool_()),  # within the kernel tests' tolerance
        pa.field("requester", pa.int32(), nullable=False),  # v2: the rank that asked and timed
        pa.field("round", pa.int32(), nullable=False),  # v2: which pass over the cases
        # v3: messages the fetch sent (1 packed, one per page when sent from the cache)
        pa.field("segments", pa.int32(), nullable=False),
        pa.field("process_run", pa.int32(), nullable=False),  # v4: which launch (--runs)
        # v4: the sample's mean time per phase (null where the option has no such phase)
        pa.field("send_us", pa.float64()),
        pa.field("attention_us", pa.float64()),
        pa.field("return_us", pa.float64()),
        pa.field("merge_us", pa.float64()),
        pa.field("transfer_us", pa.float64()),
        pa.field("move_us", pa.float64()),
    ]
)

DECISIONS = "decisions"
# One row per request shape: the request (the fields of xbench.core.costmodel.Request), the
# decision, each option's time per use in seconds, and the closed forms on the chosen fabric.
DECISIONS_SCHEMA = pa.schema(
    [
        pa.field("rows", pa.int64()),  # b: decode tokens routed together
        pa.field("heads", pa.int64()),
        pa.field("chunk_tokens", pa.int64()),
        pa.field("reuse", pa.float64()),
        pa.field("fabric", pa.string()),  # the fabric asked for; null: every fabric competed
        pa.field("payload_bytes", pa.float64()),  # per query row
        pa.field("return_bytes", pa.float64()),
        pa.field("kv_bytes_per_token", pa.float64()),
        pa.field("segments", pa.int64()),
        pa.field("include_probe", pa.bool_()),
        pa.field("fetch_cost", pa.float64()),  # s; null: the profile's T_move
        pa.field("layers", pa.int64(), nullable=False),  # L: the times cover L layers' step
        pa.field("holders", pa.int64(), nullable=False),  # k: instances the chunk is on
        pa.field("pipeline_layers", pa.bool_(), nullable=False),  # route's trip once a step
        pa.field("decision", pa.string(), nullable=False),  # route, fetch, local
        pa.field("fabric_chosen", pa.string(), nullable=False),
        pa.field("t_route", pa.float64(), nullable=False),  # s per use
        pa.field("t_fetch", pa.float64(), nullable=False),
        pa.field("t_local", pa.float64(), nullable=False),  # inf: no local option
        pa.field("margin", pa.float64(), nullable=False),  # runner-up minus winner, s
        pa.field("uncertain", pa.bool_(), nullable=False),
        # the wire term that ranked the chosen fabric: latency, bandwidth, overhead; none
        # where local wins (v2: latency or bandwidth, from the message size against n_1/2)
        pa.field("ranked_by", pa.string(), nullable=False),
        pa.field("prior", pa.bool_(), nullable=False),  # rests on a datasheet prior
        pa.field("b_star", pa.float64(), nullable=False),  # route wins for b < b*
        pa.field("u_star", pa.float64(), nullable=False),  # fetch wins once 1 + reuse > u*
        # route wins while its bytes a row (out and back) are below P*, fetch while a
        # layer's move costs less than F* (s)
        pa.field("payload_star", pa.float64()),
        pa.field("fetch_cost_star", pa.float64()),
        pa.field("n_half_bytes", pa.float64(), nullable=False),  # alpha * beta, chosen fabric
    ]
)

VALIDATE_SUMMARY = "validate_summary"
VALIDATE_SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("option", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("heads", pa.int64(), nullable=False),
        pa.field("chunk_tokens", pa.int64(), nullable=False),
        pa.field("segments", pa.int64(), nullable=False),
        pa.field("measured_us", pa.float64(), nullable=False),
        pa.field("ci_low_us", pa.float64(), nullable=False),
        pa.field("ci_coverage", pa.float64(), nullable=False),
        pa.field("ci_high_us", pa.float64(), nullable=False),
        pa.field("predicted_us", pa.float64(), nullable=False),
        pa.field("error", pa.float64(), nullable=False),  # (predicted - measured) / measured
        pa.field("correct", pa.bool_(), nullable=False),
        pa.field("max_abs_error", pa.float64()),
        pa.field("predicted_with_measured_tc_us", pa.float64()),
        pa.field("composition_error", pa.float64()),
        # v2: per phase, the measured median and the model's term (null where not a phase)
        *(
            pa.field(f"{kind}_{phase}_us", pa.float64())
            for phase in ("send", "attention", "return", "merge", "transfer", "move")
            for kind in ("measured", "predicted")
        ),
    ]
)

COMPARISON = "comparison"
COMPARISON_SCHEMA = pa.schema(
    [
        pa.field("case", pa.string(), nullable=False),  # the case's label
        pa.field("case_key", pa.string(), nullable=False),  # every key column, joined
        pa.field("unit", pa.string(), nullable=False),
        pa.field("n_baseline", pa.int64(), nullable=False),  # measured samples
        pa.field("n_candidate", pa.int64(), nullable=False),
        pa.field("launches_baseline", pa.int64(), nullable=False),  # process launches
        pa.field("launches_candidate", pa.int64(), nullable=False),
        pa.field("baseline", pa.float64()),  # median (of launch medians when tested by launch)
        pa.field("candidate", pa.float64()),
        pa.field("ratio", pa.float64()),  # candidate / baseline
        pa.field("ratio_low", pa.float64()),  # bootstrap interval of the ratio
        pa.field("ratio_high", pa.float64()),
        pa.field("ci_coverage", pa.float64()),
        pa.field("p_value", pa.float64()),
        pa.field("q_value", pa.float64()),  # Benjamini-Hochberg over the cases tested
        pa.field(
            "test", pa.string()
        ),  # mann-whitney or welch t on launch medians / mann-whitney on samples
        pa.field("reason", pa.string()),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("change", pa.float64()),  # fraction worse (+) or better (-)
        pa.field("launch_sd", pa.float64()),  # pooled sd of log launch medians (by launch)
        pa.field("detectable", pa.float64()),  # smallest change caught, 80 % power, alone
    ]
)

SIMULATION = "simulation"
SIMULATION_SCHEMA = pa.schema(
    [
        pa.field("fabric", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),  # route, fetch, local, predicate
        pa.field("requests", pa.int64(), nullable=False),
        pa.field("p50_us", pa.float64(), nullable=False),
        pa.field("p90_us", pa.float64(), nullable=False),
        pa.field("p99_us", pa.float64(), nullable=False),
        pa.field("mean_us", pa.float64(), nullable=False),
        pa.field("throughput_per_s", pa.float64(), nullable=False),
        pa.field("bytes_moved", pa.float64(), nullable=False),
        pa.field("link_util_mean", pa.float64(), nullable=False),  # egress busy / makespan
        pa.field("link_util_max", pa.float64(), nullable=False),
        pa.field("compute_util_mean", pa.float64(), nullable=False),
        pa.field("compute_util_max", pa.float64(), nullable=False),
        pa.field("share_present", pa.float64(), nullable=False),  # chunk home or cached
        pa.field("share_route", pa.float64(), nullable=False),
        pa.field("share_fetch", pa.float64(), nullable=False),
        pa.field("share_local", pa.float64(), nullable=False),
        pa.field("batches", pa.int64(), nullable=False),  # batched attention calls at holders
        pa.field("mean_batch_rows", pa.float64()),
        pa.field("gain_vs_best_static", pa.float64()),  # predicate mean / best of route, fetch - 1
        pa.field("offered_per_s", pa.float64()),  # requests a second the trace offered
        # about the most the busiest compute or link keeps up with: requests / its busy time
        pa.field("sustainable_per_s", pa.float64()),
    ]
)

PREFILL_SIMULATION = "prefill_simulation"
PREFILL_SIMULATION_SCHEMA = pa.schema(
    [
        pa.field("fabric", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),  # local, offload, threshold, predicate
        pa.field("threshold_tokens", pa.float64()),  # threshold: offload above this length
        pa.field("best", pa.bool_(), nullable=False),  # the threshold the grid search keeps
        pa.field("requests", pa.int64(), nullable=False),
        pa.field("p50_ms", pa.float64(), nullable=False),  # arrival to the KV being here
        pa.field("p90_ms", pa.float64(), nullable=False),
        pa.field("p99_ms", pa.float64(), nullable=False),
        pa.field("mean_ms", pa.float64(), nullable=False),
        pa.field("throughput_per_s", pa.float64(), nullable=False),
        pa.field("share_offloaded", pa.float64(), nullable=False),
        pa.field("bytes_moved", pa.float64(), nullable=False),
        pa.field("link_util", pa.float64(), nullable=False),  # link busy / makespan
        pa.field("link_gbps", pa.float64(), nullable=False),  # bits moved / makespan
        pa.field("local_util", pa.float64(), nullable=False),  # mean over instances
        pa.field("remote_util", pa.float64(), nullable=False),
        pa.field("hit_rate", pa.float64()),  # prompt tokens from a prefix cache
    ]
)

# the reports beside a simulation's table (``xbench simulate --out``)
PREFILL_SATURATION = "prefill_saturation"
PREFILL_SATURATION_SCHEMA = pa.schema(
    [
        pa.field("fabric", pa.string(), nullable=False),
        pa.field("deployment", pa.string(), nullable=False),  # homogeneous, naive ..., PrfaaS
        pa.field("policy", pa.string(), nullable=False),
        pa.field("threshold_tokens", pa.float64()),  # the threshold's best t at saturation
        pa.field("max_rate_per_s", pa.float64(), nullable=False),  # highest rate kept up with
        # rate / homogeneous's - 1; null against a deployment that kept up with none
        pa.field("vs_homogeneous", pa.float64()),
        pa.field("vs_naive", pa.float64()),
        # v2: against the homogeneous deployment of both clusters' GPU count (null in v1)
        pa.field("vs_same_gpus", pa.float64()),
        # v3: this cluster's instances split between prefill and decode, what its decode
        # instances keep up with, and one decode instance at full batch (without decode,
        # every instance prefills and the decode figures are null; all null in v2)
        pa.field("prefill_instances", pa.int32()),
        pa.field("decode_instances", pa.int32()),
        pa.field("decode_rate_per_s", pa.float64()),
        pa.field("decode_batch", pa.float64()),
        pa.field("decode_batch_bound", pa.string()),  # memory or decode_batch
        pa.field("decode_step_s", pa.float64()),
        pa.field("decode_linear_s", pa.float64()),
        pa.field("decode_attention_s", pa.float64()),
        pa.field("decode_per_instance_per_s", pa.float64()),
        # v4: each request's output tokens (0: no decode; null in v3)
        pa.field("output_tokens", pa.int32()),
    ]
)
# what v3 added: the split and the decode figures
SATURATION_DECODE_COLUMNS = tuple(PREFILL_SATURATION_SCHEMA.names[-10:-1])
SHARING_CALLS = "sharing_calls"
SHARING_CALLS_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64(), nullable=False),  # B queries over one shared chunk
        pa.field("batched_s", pa.float64(), nullable=False),  # one call of B x heads rows
        pa.field("separate_s", pa.float64(), nullable=False),  # B calls of heads rows
        pa.field("gain", pa.float64(), nullable=False),
    ]
)
SHARING_STEPS = "sharing_steps"
SHARING_GPU_COLUMNS = [
    "kv_bytes_per_token",  # every layer's
    "copy_bytes",
    "gpus_per_copy",
    *[
        f"{setup}_{what}"
        for setup in ("moska", "apart", "copies")
        for what in ("gpus", "hbm_share", "utilisation", "per_gpu_per_s")
    ],
    "moska_gain_per_gpu",
    "apart_gain_per_gpu",
]
SHARING_STEPS_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("shared_tokens", pa.int64(), nullable=False),
        pa.field("unique_tokens", pa.int64(), nullable=False),
        pa.field("keep", pa.float64(), nullable=False),  # share of shared chunks routed to
        pa.field("chunks_read", pa.float64(), nullable=False),
        pa.field("queries_per_chunk", pa.float64(), nullable=False),
        pa.field("shared_s", pa.float64(), nullable=False),  # a decode step, every layer
        pa.field("unique_s", pa.float64(), nullable=False),
        pa.field("merge_s", pa.float64(), nullable=False),
        pa.field("step_s", pa.float64(), nullable=False),
        pa.field("separate_step_s", pa.float64(), nullable=False),  # each its own copy
        pa.field("throughput_per_s", pa.float64(), nullable=False),
        pa.field("separate_throughput_per_s", pa.float64(), nullable=False),
        pa.field("gain", pa.float64(), nullable=False),
        pa.field("gain_unique_elsewhere", pa.float64(), nullable=False),
        # v2: the step on GPUs of the profile's HBM, the weights on each (core.sharing.on_gpus;
        # null where the profile gives no HBM or the model no parameter count)
        *[
            pa.field(
                name,
                pa.int64() if name.endswith("gpus") or name == "gpus_per_copy" else pa.float64(),
            )
            for name in SHARING_GPU_COLUMNS
        ],
    ]
)
SPAN_HITS = "span_hits"
SPAN_TTFT_TERMS = [  # core.costmodel.RECOMPUTE_TERMS of each cache's TTFT
    f"ttft_{cache}_{term}_s"
    for cache in ("dependent", "independent")
    for term in ("fixed", "matmul", "attention")
]
SPAN_HITS_SCHEMA = pa.schema(
    [
        pa.field("expr", pa.string(), nullable=False),  # as the parser renders it
        pa.field("tokens", pa.int64(), nullable=False),
        pa.field("hit_tokens_dependent", pa.int64(), nullable=False),  # prefix caching
        pa.field("hit_rate_dependent", pa.float64(), nullable=False),
        pa.field("ttft_dependent_s", pa.float64()),  # null without a prefill cost
        pa.field("hit_tokens_independent", pa.int64(), nullable=False),
        pa.field("hit_rate_independent", pa.float64(), nullable=False),
        pa.field("ttft_independent_s", pa.float64()),
        # the prefill the TTFT columns price: the model's layers over the instance's GPUs
        # (null without a prefill cost)
        pa.field("prefill_layers", pa.int32()),
        pa.field("prefill_gpus", pa.int32()),
        # v3: the calls (an expression's inner gen(...) calls, then itself): the expression
        # each belongs to (its index in the workload) and what it generates ("" for data)
        pa.field("request", pa.int64(), nullable=False),
        pa.field("output", pa.string(), nullable=False),
        # v3: each TTFT's terms (a call's fixed time, matmuls, attention), and prefix
        # caching's TTFT over span caching's (null without a prefill cost)
        *[pa.field(name, pa.float64()) for name in SPAN_TTFT_TERMS],
        pa.field("ttft_ratio", pa.float64()),
    ]
)
OWN_COPIES = "own_copies"
OWN_COPIES_SCHEMA = pa.schema(
    [
        pa.field("fabric", pa.string(), nullable=False),
        pa.field("policy", pa.string(), nullable=False),  # the top-k workload's
        pa.field("throughput_per_s", pa.float64(), nullable=False),  # requests, at saturation
        pa.field("copies_throughput_per_s", pa.float64(), nullable=False),  # a copy each
        pa.field("gain", pa.float64(), nullable=False),
        pa.field("mean_us", pa.float64(), nullable=False),
        pa.field("copies_mean_us", pa.float64(), nullable=False),
        pa.field("queries_per_call", pa.float64(), nullable=False),  # a shared chunk's call
        # the closed form (core.sharing.step) at the batch whose calls hold as many queries
        pa.field("closed_form_batch", pa.float64(), nullable=False),
        pa.field("closed_form_gain", pa.float64(), nullable=False),
        pa.field("link_util_max", pa.float64(), nullable=False),
        pa.field("compute_util_max", pa.float64(), nullable=False),
        pa.field("copies_compute_util_max", pa.float64(), nullable=False),
    ]
)

# each report's name in its file (NAME.<report>.parquet beside NAME.parquet) and its table
SIMULATION_REPORTS = {
    "saturation": PREFILL_SATURATION,
    "sharing-calls": SHARING_CALLS,
    "sharing-steps": SHARING_STEPS,
    "span-hits": SPAN_HITS,
    "copies": OWN_COPIES,
}

SIMULATION_VALIDATION = "simulation_validation"
REPLAY_STATS = ("p50_us", "p99_us", "mean_us", "throughput_per_s")  # per policy and replay
SIMULATION_VALIDATION_SCHEMA = pa.schema(
    [
        pa.field("policy", pa.string(), nullable=False),
        # v2: the costs simulated: the profile's, or those a calibration replay measured
        pa.field("costs", pa.string(), nullable=False),
        pa.field("requests", pa.int64(), nullable=False),
        pa.field("rate_per_s", pa.float64(), nullable=False),
        *[
            pa.field(f"{kind}_{stat}", pa.float64())
            for stat in REPLAY_STATS
            for kind in ("simulated", "measured", "error")  # error: simulated / measured - 1
        ],
        pa.field(
            "routed_instead", pa.int64(), nullable=False
        ),  # replayed decisions it could not follow
        # v3: replays of the validated trace, and how far the others landed from the first
        # (the largest |again / measured - 1|; null with one replay): the method's floor
        pa.field("replays", pa.int32(), nullable=False),
        *[pa.field(f"floor_{stat}", pa.float64()) for stat in REPLAY_STATS],
        # v4: what measured and simulated are: "one" round's replay, the "median" over
        # rounds (each a calibration replay, then the trace's; floor: the largest
        # |replay / median - 1|), or the "first" of several replays in a row (v3, floor:
        # the largest |again / first - 1|)
        pa.field("central", pa.string(), nullable=False),
        # v5: each error's interval over the paired rounds (Student's t on the rounds' log
        # errors; null with one round) and its nominal coverage: the floor (one replay's
        # largest distance from the median) is not the spread of a median's error
        *[
            pa.field(f"error_{end}_{stat}", pa.float64())
            for stat in REPLAY_STATS
            for end in ("low", "high")
        ],
        pa.field("error_coverage", pa.float64()),
    ]
)

SCHEMAS = {
    PROBE_SAMPLES: PROBE_SAMPLES_SCHEMA,
    KERNEL_SAMPLES: KERNEL_SAMPLES_SCHEMA,
    VALIDATE_SAMPLES: VALIDATE_SAMPLES_SCHEMA,
    DECISIONS: DECISIONS_SCHEMA,
    VALIDATE_SUMMARY: VALIDATE_SUMMARY_SCHEMA,
    COMPARISON: COMPARISON_SCHEMA,
    SIMULATION: SIMULATION_SCHEMA,
    PREFILL_SIMULATION: PREFILL_SIMULATION_SCHEMA,
    SIMULATION_VALIDATION: SIMULATION_VALIDATION_SCHEMA,
    PREFILL_SATURATION: PREFILL_SATURATION_SCHEMA,
    SHARING_CALLS: SHARING_CALLS_SCHEMA,
    SHARING_STEPS: SHARING_STEPS_SCHEMA,
    SPAN_HITS: SPAN_HITS_SCHEMA,
    OWN_COPIES: OWN_COPIES_SCHEMA,
}
SCHEMA_VERSIONS = {
    PROBE_SAMPLES: 2,
    KERNEL_SAMPLES: 7,
    VALIDATE_SAMPLES: 4,
    DECISIONS: 3,
    VALIDATE_SUMMARY: 2,
    COMPARISON: 2,
    SIMULATION: 2,
    PREFILL_SIMULATION: 2,
    PREFILL_SATURATION: 4,
    SHARING_CALLS: 1,
    SHARING_STEPS: 2,
    SPAN_HITS: 3,
    OWN_COPIES: 1,
    SIMULATION_VALIDATION: 5,
}


def _added_phase_columns(table: pa.Table) -> pa.Table:
    table = _added_int_columns(process_run=0)(table)
    for name in ("send", "attention", "return", "merge", "transfer", "move"):
        table = table.append_column(
            pa.field(f"{name}_us", pa.float64()), pa.nulls(table.num_rows, pa.float64())
        )
    return table


def _added_summary_phase_columns(table: pa.Table) -> pa.Table:
    for phase in ("send", "attention", "return", "merge", "transfer", "move"):
        for kind in ("measured", "predicted"):
            table = table.append_column(
                pa.field(f"{kind}_{phase}_us", pa.float64()), pa.nulls(table.num_rows, pa.float64())
            )
    return table


def _added_span_prefill_columns(table: pa.Table) -> pa.Table:
    """v1 priced its TTFT as one layer's prefill on one GPU (null where it had none)."""
    priced = [v is not None for v in table.column("ttft_dependent_s").to_pylist()]
    for name in ("prefill_layers", "prefill_gpus"):
        table = table.append_column(
            pa.field(name, pa.int32()), pa.array([1 if p else None for p in priced], pa.int32())
        )
    return table


def _added_span_call_columns(table: pa.Table) -> pa.Table:
    """v2 had one data-only call per expression, in order; it recorded no terms."""
    table = table.append_column(
        pa.field("request", pa.int64(), nullable=False), pa.array(range(table.num_rows), pa.int64())
    )
    table = _added_columns(pa.string(), output="")(table)
    return _added_null_columns(*SPAN_TTFT_TERMS, "ttft_ratio")(table)


def _added_sharing_gpu_columns(table: pa.Table) -> pa.Table:
    """v1 priced a step's device time only: no GPUs, memory or utilisation (null)."""
    for f in SHARING_STEPS_SCHEMA:
        if f.name in SHARING_GPU_COLUMNS:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def _added_costs_column(table: pa.Table) -> pa.Table:
    return table.add_column(
        1, pa.field("costs", pa.string(), nullable=False), pa.array(["profile"] * table.num_rows)
    )


def _added_floor_columns(table: pa.Table) -> pa.Table:
    table = _added_int_columns(replays=1)(table)
    for stat in REPLAY_STATS:
        table = table.append_column(
            pa.field(f"floor_{stat}", pa.float64()), pa.nulls(table.num_rows, pa.float64())
        )
    return table


def _added_error_intervals(table: pa.Table) -> pa.Table:
    for stat in REPLAY_STATS:
        for end in ("low", "high"):
            table = table.append_column(
                pa.field(f"error_{end}_{stat}", pa.float64()),
                pa.nulls(table.num_rows, pa.float64()),
            )
    return table.append_column(
        pa.field("error_coverage", pa.float64()), pa.nulls(table.num_rows, pa.float64())
    )


def _added_central_column(table: pa.Table) -> pa.Table:
    """v3 compared the first of its replays (the only one where it had one)."""
    replays = table.column("replays").to_pylist()
    return table.append_column(
        pa.field("central", pa.string(), nullable=False),
        pa.array(["first" if n > 1 else "one" for n in replays], pa.string()),
    )


def _added_step_columns(table: pa.Table) -> pa.Table:
    table = _added_columns(pa.int64(), layers=1, holders=1)(table)
    table = _added_columns(pa.bool_(), pipeline_layers=False)(table)
    for name in ("payload_star", "fetch_cost_star"):
        table = table.append_column(
            pa.field(name, pa.float64()), pa.nulls(table.num_rows, pa.float64())
        )
    return table


def _added_null_columns(*names):
    """A migration for a version that added float columns older files did not record."""

    def migrate(table: pa.Table) -> pa.Table:
        for name in names:
            table = table.append_column(
                pa.field(name, pa.float64()), pa.nulls(table.num_rows, pa.float64())
            )
        return table

    return migrate


def _added_saturation_decode_columns(table: pa.Table) -> pa.Table:
    """prefill_saturation v2 to v3: no decode, so no split and no decode figures (null)."""
    for name in SATURATION_DECODE_COLUMNS:
        field = PREFILL_SATURATION_SCHEMA.field(name)
        table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table


def _added_saturation_output_tokens(table: pa.Table) -> pa.Table:
    """prefill_saturation v3 to v4: the output tokens were not recorded (null)."""
    field = PREFILL_SATURATION_SCHEMA.field("output_tokens")
    return table.append_column(field, pa.nulls(table.num_rows, field.type))


# MIGRATIONS[table][v] turns a pyarrow.Table of version v into version v + 1.
def _added_columns(arrow_type, **defaults):
    """A migration for a version that added columns of one type: older rows read as these."""

    def migrate(table: pa.Table) -> pa.Table:
        for name, value in defaults.items():
            table = table.append_column(
                pa.field(name, arrow_type, nullable=False),
                pa.array([value] * table.num_rows, arrow_type),
            )
        return table

    return migrate


def _added_int_columns(**defaults: int):
    """A migration for a version that added int32 columns: older rows held these values."""
    return _added_columns(pa.int32(), **defaults)


MIGRATIONS: dict[str, dict[int, object]] = {
    PROBE_SAMPLES: {1: _added_int_columns(process_run=0)},  # v1: one launch
    KERNEL_SAMPLES: {
        1: _added_int_columns(round=0),  # v1: one pass
        2: _added_int_columns(
            process_run=0, timed_by=0, after_tokens=0
        ),  # v2: one launch, back to back
        3: _added_int_columns(idle_us=0),  # v3: no call after idle
        4: _added_int_columns(wait_us=0),  # v4: no call after a wait
        5: _added_int_columns(after_splice_tokens=0),  # v5: no attention after a splice
        6: _added_columns(pa.string(), launch="", plan=""),  # v6: neither recorded ("")
    },
    VALIDATE_SUMMARY: {1: _added_summary_phase_columns},  # v1: no phases
    DECISIONS: {2: _added_step_columns},  # v2: one layer on one holder
    SIMULATION_VALIDATION: {
        1: _added_costs_column,  # v1: the profile's costs only
        2: _added_floor_columns,  # v2: one replay of the validated trace
        3: _added_central_column,  # v3: the first replay compared
        4: _added_error_intervals,  # v4: no interval of the error
    },
    COMPARISON: {1: _added_null_columns("launch_sd", "detectable")},  # v1: no detectable change
    PREFILL_SIMULATION: {1: _added_null_columns("hit_rate")},  # v1: not recorded
    PREFILL_SATURATION: {
        1: _added_null_columns("vs_same_gpus"),  # v1: no such deployment
        2: _added_saturation_decode_columns,  # v2: no decode
        3: _added_saturation_output_tokens,  # v3: its output tokens not recorded
    },
    SPAN_HITS: {1: _added_span_prefill_columns, 2: _added_span_call_columns},
    SHARING_STEPS: {1: _added_sharing_gpu_columns},  # v1: one GPU's device time only
    SIMULATION: {
        1: _added_null_columns("offered_per_s", "sustainable_per_s")
    },  # v1: one layer on one GPU
    VALIDATE_SAMPLES: {
        1: _added_int_columns(requester=0, round=0),  # v1: rank 0 asked, one pass
        2: _added_int_columns(segments=1),  # v2: fetches were packed into one message
        3: _added_phase_columns,  # v3: one launch, no phases timed
    },
}
