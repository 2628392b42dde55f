"""validate's wires: MPI on the tensors' memory (host), or through host buffers around MPI
(staged, for GPU tensors with an MPI that is not CUDA-aware), torch.distributed (nccl) and
NVSHMEM puts (nvshmem). The staged wire runs here on CPU tensors through the same code,
against a fake communicator that records what MPI was handed, and end to end between two
real ranks; nccl's code path runs over gloo; nvshmem's against a stand-in nvshmem4py
(tests/fake_nvshmem) that moves the bytes between the two ranks' processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench.validate.wire import (
    CudaAwareWire,
    HostWire,
    StagedWire,
    byte_view,
    make_wire,
    transport_label,
)

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi


class _Comm:
    """MPI's point-to-point calls, recording the buffers they are handed; a receive fills
    its buffer with the next of ``incoming``."""

    def __init__(self, incoming=()):
        self.calls, self.incoming = [], list(incoming)

    def Send(self, buf, dest, tag):
        self.calls.append(("Send", buf.copy(), dest, tag, buf.ctypes.data))

    def Recv(self, buf, source, tag):
        buf[:] = self.incoming.pop(0)
        self.calls.append(("Recv", len(buf), source, tag, buf.ctypes.data))

    def Isend(self, buf, dest, tag):
        self.calls.append(("Isend", buf.copy(), dest, tag, buf.ctypes.data))
        return None

    def Irecv(self, buf, source, tag):
        buf[:] = self.incoming.pop(0)
        self.calls.append(("Irecv", len(buf), source, tag, buf.ctypes.data))
        return None


@pytest.fixture(autouse=True)
def no_waitall(monkeypatch):
    """The fake's requests complete at once: nothing to wait for."""
    from xbench.validate import wire

    monkeypatch.setattr(wire, "_waitall", lambda requests: None)


def test_the_staged_wire_hands_mpi_a_host_copy_of_exactly_the_messages_bytes():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).bfloat16()
    comm = _Comm()
    wire = StagedWire(comm, "cpu")
    wire.send(t, 1, 7)
    (call,) = comm.calls
    assert call[0] == "Send" and call[2:4] == (1, 7)
    assert np.array_equal(call[1], byte_view(t).numpy())  # the bytes, bf16 as sent
    assert call[4] != t.data_ptr()  # a host buffer of its own, not the tensor's memory
    wire.send(t, 1, 7)
    assert comm.calls[1][4] == call[4]  # registered once, reused for the next message


def test_the_staged_wire_lands_received_bytes_in_the_tensor():
    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    expected = torch.randn(2, 3).bfloat16()
    comm = _Comm([byte_view(expected).numpy()])
    StagedWire(comm, "cpu").recv(t, 0, 2)
    assert torch.equal(t, expected) and comm.calls[0][4] != t.data_ptr()


def test_pages_go_as_one_message_each_and_land_where_they_belong():
    skv = torch.zeros(4, 8, dtype=torch.bfloat16)
    pages = [byte_view(skv)[:24], byte_view(skv)[24:]]  # a partly selected last page
    sent = torch.randn(4, 8).bfloat16()
    comm = _Comm([byte_view(sent).numpy()[:24], byte_view(sent).numpy()[24:]])
    StagedWire(comm, "cpu").recv_all(pages, 1, 5)
    assert [c[:4] for c in comm.calls] == [("Irecv", 24, 1, 5), ("Irecv", 40, 1, 5)]
    assert torch.equal(skv, sent)
    out = _Comm()
    StagedWire(out, "cpu").send_all([sent[0], sent[1]], 0, 5)
    assert [np.array_equal(c[1], byte_view(sent[i]).numpy()) for i, c in enumerate(out.calls)] == [
        True,
        True,
    ]


def test_the_host_wire_hands_mpi_the_tensors_own_memory_and_refuses_gpu_tensors():
    t = torch.ones(4, dtype=torch.float32)
    comm = _Comm()
    HostWire(comm).send(t, 1, 3)
    assert comm.calls[0][4] == t.data_ptr()  # in place, no copy
    with pytest.raises(ValueError, match="staged"):
        make_wire("host", comm, "cuda")
    assert transport_label("host") == "mpi" and transport_label("staged") == "mpi-staged"


def test_the_cuda_aware_wire_hands_mpi_the_tensors_themselves():
    """No host copy: MPI gets the tensor (its memory, through DLPack), and GPU tensors are
    labelled as what crossed (mpi-cuda), CPU ones as plain MPI."""
    sent = []

    class Comm:
        def Send(self, buf, dest, tag):
            sent.append((buf, dest, tag))

    t = torch.arange(6, dtype=torch.float32)
    CudaAwareWire(Comm(), "cpu").send(t, 1, 3)
    ((buf, dest, tag),) = sent
    assert isinstance(buf, torch.Tensor) and buf.data_ptr() == t.data_ptr()
    assert (dest, tag, buf.dtype, buf.numel()) == (1, 3, torch.uint8, 24)
    assert transport_label("cuda-aware", "cuda") == "mpi-cuda"
    assert transport_label("cuda-aware", "cpu") == "mpi"


def test_the_cuda_aware_wire_asks_the_mpi_before_it_hands_it_a_gpu(monkeypatch):
    """On GPUs the MPI says first whether it takes device memory (here it cannot say: it
    was never started), refused in one line pointing at the staged wire; CPUs ask nothing."""
    from xbench.errors import XbenchError
    from xbench.fabric import mpi_device

    monkeypatch.delenv(mpi_device.ASSUME_ENV, raising=False)
    monkeypatch.setattr(mpi_device, "_mpi_started", lambda: False)  # no MPI in pytest
    with pytest.raises(XbenchError) as err:
        CudaAwareWire.start_run(None, 0)
    assert "CUDA-aware" in err.value.problem and "--wire staged" in err.value.fix
    CudaAwareWire.start_run(None, None)


@pytest.mark.mpi  # starts MPI: runs under every MPI
@pytest.mark.parametrize(
    "wire, transport", [("staged", "mpi-staged"), ("cuda-aware", "mpi"), ("nccl", "gloo")]
)
def test_validate_over_each_wire_between_two_ranks(xbench, tmp_path, wire, transport):
    """Every path's output still matches one-instance attention through host buffers around
    MPI (staged), with MPI handed the tensors themselves (cuda-aware's code path on CPUs:
    torch tensors through DLPack) and through torch.distributed on them (nccl's code path
    on CPUs: gloo), a fetch's pages as messages of their own; the samples say which wire
    carried them."""
    out = tmp_path / "v"
    r = xbench(
        "validate", "--profile", "profiles/h100-priors.toml", "--fabric", "ib",
        "--wire", wire, "--rows", "1,2", "--chunk", "128", "--heads", "4",
        "--samples", "2", "--rounds", "1", "--cpu-attention", "torch",
        "--out", out, "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert all(row["correct"] for row in json.loads(r.stdout))
    from xbench.results.schema import VALIDATE_SAMPLES
    from xbench.results.store import read_run_meta, read_table

    samples = read_table(out, VALIDATE_SAMPLES)
    assert set(samples.transport) == {transport} and samples.correct.all()
    assert (samples[samples.option == "fetch"].segments > 1).all()  # pages as messages
    meta = read_run_meta(out)
    assert meta["wire"] == wire and meta["device"] == "cpu"


@pytest.mark.mpi  # starts MPI: runs under every MPI
def test_validate_at_a_models_heads_calls_every_path_correct(xbench, tmp_path):
    """64 decode tokens x DeepSeek's 128 heads over 64 tokens: 4 M output elements, of
    which some always lay past 8e-4 + 1.6e-2 |out| by bf16's rounding alone, so validate
    called local wrong and exited 1 (kernels.accuracy says what bound replaced it)."""
    r = xbench(
        "validate", "--profile", "profiles/h100-priors.toml", "--fabric", "ib",
        "--rows", "64", "--chunk", "64", "--heads", "128", "--samples", "1", "--rounds", "1",
        "--out", tmp_path / "v", "--format", "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {row["option"] for row in rows} == {"route", "fetch", "local"}
    assert all(row["correct"] for row in rows)


def test_validate_refuses_a_gpu_it_cannot_use_in_one_line(xbench, tmp_path):
    base = ["validate", "--profile", "profiles/h100-priors.toml", "--fabric", "ib"]
    for args, words in (
        (["--device", "tpu"], "pick cpu or cuda"),
        (["--wire", "rdma"], "pick auto, host, staged, cuda-aware, nccl, nvshmem"),
        (["--wire", "nvshmem"], "pass --device cuda"),
        (["--device", "cuda"], "torch sees none here")
        if not torch.cuda.is_available()
        else (["--device", "cuda", "--wire", "host"], "pass --wire staged"),
    ):
        r = xbench(*base, *args, "--out", tmp_path / "never")
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "never").exists()


def test_a_validate_case_past_its_timeout_leaves_each_ranks_stacks(xbench, tmp_path):
    """A case that outlasts --timeout ends the run (exit 124) in one line that names where
    rank 0's report is; each rank's report holds its stacks."""
    out = tmp_path / "v"
    r = xbench(
        "validate", "--profile", "profiles/h100-priors.toml", "--fabric", "ib", "--rows", "1",
        "--chunk", "128", "--heads", "4", "--samples", "2", "--rounds", "1",
        "--cpu-attention", "torch", "--timeout", "0.001", "--out", out,
    )  # fmt: skip
    assert r.returncode == 124 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]  # after the progress bar
    # rank 0's through its events, or another's from the log when that rank ended first
    assert re.match(r"xbench: error: (rank 1: )?validate case", line), r.stderr
    # whichever rank's watchdog fired first ends the run (the launcher stops the other)
    said = re.search(r"on rank (\d); what rank \1 waited in is in ([^;]+);", line)
    assert said and said[2] == str(out / f"hang-rank{said[1]}.txt"), line
    report = (out / f"hang-rank{said[1]}.txt").read_text()
    assert report.startswith("validate case rows=1 chunk=128 did not finish within 0.001 s")
    assert "Current thread" in report and "run_validate" in report, report


FAKE_NVSHMEM = Path(__file__).parent / "fake_nvshmem"


@pytest.mark.mpi  # starts MPI: runs under every MPI
@pytest.mark.parametrize("layout", ["pages", "packed"])
def test_validate_over_nvshmem_puts_between_two_ranks(tmp_path, layout):
    """The nvshmem wire's code, between two real ranks, against a stand-in nvshmem4py that
    moves the bytes between the two processes' symmetric heaps and enforces NVSHMEM's rules
    (allocations collective and equal, destinations, sources and signals on the heap and in
    bounds): every path matches one-instance attention; each message is one put of exactly
    its bytes (a fetch's pages one put each, then one signal); nothing is left allocated."""
    from conftest import BIN

    from xbench.results.schema import VALIDATE_SAMPLES
    from xbench.results.store import read_run_meta, read_table
    from xbench.validate import ValidateConfig

    rows, heads, chunk = (1, 2), 4, 128
    cfg = ValidateConfig(
        out_dir=str(tmp_path / "v"), run_id="nvshmem-wire", rows=rows, chunks=(chunk,),
        heads=heads, samples=2, rounds=1, cpu_attention="torch", wire="nvshmem",
        fabric="ib", fetch_layout=layout,
    )  # fmt: skip
    config = tmp_path / "validate-config.json"
    config.write_text(cfg.to_json())
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(FAKE_NVSHMEM), os.environ.get("PYTHONPATH")])
        ),
        "FAKE_NVSHMEM_LOG": str(tmp_path / "calls"),
    }
    before = set(Path("/dev/shm").glob("fake-nvshmem-*"))
    try:
        r = subprocess.run(
            [str(BIN / "mpiexec"), "-n", "2", sys.executable, "-m", "xbench.validate.worker", str(config)],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
    finally:  # a rank that failed never finalized: its heap's files stay behind
        for left in set(Path("/dev/shm").glob("fake-nvshmem-*")) - before:
            left.unlink(missing_ok=True)
    assert r.returncode == 0, r.stderr
    samples = read_table(tmp_path / "v", VALIDATE_SAMPLES)
    assert set(samples.transport) == {"nvshmem"} and samples.correct.all()
    assert read_run_meta(tmp_path / "v")["wire"] == "nvshmem"
    queries = {b * heads * 576 * 2 for b in rows}  # bf16 rows out
    partials = {b * heads * (512 * 2 + 4) for b in rows}  # bf16 output and fp32 LSE back
    page = 64 * 576 * 2
    for pe in (0, 1):
        calls = [json.loads(line) for line in (tmp_path / f"calls.{pe}").read_text().splitlines()]
        assert calls[0] == {"init": {"pe": pe, "npes": 2, "device": "None"}}
        puts = {c["put_signal"][0] for c in calls if "put_signal" in c}
        pages = [c["put_nbi"][0] for c in calls if "put_nbi" in c]
        if layout == "pages":
            assert puts == queries | partials and set(pages) == {page}
            assert sum(1 for c in calls if "signal" in c) == len(pages) // (chunk // 64)
        else:
            assert puts == queries | partials | {chunk * 576 * 2} and not pages
        assert all(c["put_signal"][2] == 1 - pe for c in calls if "put_signal" in c)
        assert calls[-1] == {"finalize": {"live": []}}  # every case gave its memory back


def test_compute_calls_are_prepared_before_any_is_timed():
    """validate's compute calls (calls.py): while preparing, each key is recorded (on a GPU,
    its graph captured) and nothing runs; afterwards a key is run (or replayed), and one
    never prepared is refused, so a path that makes a call prepare() misses fails here on
    CPUs rather than capturing a graph inside a timed sample on a GPU."""
    from xbench.validate.calls import CaseCalls

    calls, ran = CaseCalls(graphs=False), []
    calls.preparing = True
    assert calls(("local attention", 0), lambda: ran.append("prepared")) is None
    calls.preparing = False
    assert calls(("local attention", 0), lambda: ran.append("timed") or "out") == "out"
    assert ran == ["timed"]
    with pytest.raises(RuntimeError, match="fetch splice on set 3 was not prepared"):
        calls(("fetch splice", 3), lambda: None)


def test_validate_on_gpus_says_what_its_messages_went_through(capsys):
    """One GPU's run (two ranks sharing it, staged through host buffers) is predicted with
    a fabric's wire terms the messages never crossed: the summary says so."""
    from xbench.cli.validate import _gpu_note

    _gpu_note({"wire": "staged", "launch": "graph"}, "nvlink")
    said = " ".join(capsys.readouterr().out.split())
    assert (
        "messages through mpi-staged (--wire staged), predicted with nvlink's wire terms; "
        "compute calls replayed from CUDA graphs" in said
    ), said
