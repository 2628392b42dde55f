"""What a rank leaves behind when its case outlasts the timeout: every thread's stack and,
over TCP, the kernel's view of the connection (a retransmission timer backing off reads
differently from a peer that never sent)."""

from __future__ import annotations

import socket
import time

import pytest

from xbench.fabric.tcp import connection_state
from xbench.fabric.watchdog import write_hang_report

# no MPI but in the tests marked mpi (conftest: the Open MPI run skips the others)
pytestmark = pytest.mark.nompi


@pytest.fixture
def connected():
    """Two ends of a real TCP connection over loopback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    yield client, server
    client.close()
    server.close()


def test_the_connection_state_counts_what_waits_unread(connected):
    client, server = connected
    client.sendall(b"x" * 10_000)
    deadline = time.monotonic() + 5
    said = connection_state(server)
    while "10,000 B unread" not in said and time.monotonic() < deadline:
        time.sleep(0.01)
        said = connection_state(server)
    assert said.startswith("TCP established: 10,000 B unread, 0 B unacknowledged"), said
    assert "0 lost" in said and "backoff 0, 0 timeouts in a row" in said, said
    server.recv(10_000, socket.MSG_WAITALL)
    said = connection_state(server)
    assert said.startswith("TCP established: 0 B unread"), said
    client.shutdown(socket.SHUT_WR)  # the peer's FIN: the state the kernel reports changes
    deadline = time.monotonic() + 5
    while not connection_state(server).startswith("TCP close-wait"):
        assert time.monotonic() < deadline, connection_state(server)
        time.sleep(0.01)


def test_the_report_has_the_lines_and_every_threads_stack(tmp_path):
    path = tmp_path / "hang-rank3.txt"
    said = write_hang_report(str(path), ["case 'x' did not finish", "tcp transport: -"])
    assert said == f"in {path}"
    text = path.read_text()
    assert text.startswith("case 'x' did not finish\ntcp transport: -\n\n")
    assert "Current thread" in text
    assert "test_the_report_has_the_lines_and_every_threads_stack" in text  # this frame


def test_a_report_that_cannot_be_written_goes_to_stderr(tmp_path, capfd):
    missing = tmp_path / "not-here" / "hang-rank1.txt"  # a node without the run's folder
    assert write_hang_report(str(missing), ["case 'y' did not finish"]) == "on stderr"
    err = capfd.readouterr().err
    assert err.startswith("xbench: case 'y' did not finish\n") and "Current thread" in err
    assert not missing.parent.exists()


def test_stopped_ranks_stacks_reach_the_log_whole_and_in_rank_order(tmp_path):
    """Ranks stopped together once wrote their stacks to one log, faulthandler's few bytes
    at a time, and cut each other's lines; each now writes a file of its own, which the
    launcher adds to the log rank after rank (10 after 2) and removes."""
    import os
    import signal
    import subprocess
    import sys

    from xbench.ranks import STACKS_ON_STOP, append_stopped_stacks, stacks_file_prefix

    log_path = tmp_path / "launcher.log"
    where = f"{socket.gethostname()}:{stacks_file_prefix(log_path)}"
    waits = (
        "import time; from xbench.ranks import dump_stacks_when_stopped\n"
        # ready once inside the function the stack must show (a signal between the print
        # and the call found the rank outside it)
        "def waits_for_its_peer():\n    print('ready', flush=True)\n    time.sleep(60)\n"
        "dump_stacks_when_stopped(); waits_for_its_peer()\n"
    )
    ranks = {}
    for rank in ("10", "2", "0"):
        env = {**os.environ, STACKS_ON_STOP: where, "PMI_RANK": rank}
        ranks[rank] = subprocess.Popen(
            [sys.executable, "-c", waits], env=env, stdout=subprocess.PIPE, text=True
        )
    for proc in ranks.values():
        assert proc.stdout.readline() == "ready\n"
    for rank in ("10", "0"):  # rank 2 ends without being stopped: nothing of it is added
        ranks[rank].send_signal(signal.SIGTERM)
        assert ranks[rank].wait(timeout=30) == -signal.SIGTERM
    ranks["2"].kill()
    ranks["2"].wait()
    with open(log_path, "a") as log:
        log.write("$ mpiexec ...\n")
        append_stopped_stacks(log, log_path)
    text = log_path.read_text()
    assert text.index("rank 0 was stopped here:") < text.index("rank 10 was stopped here:")
    assert "rank 2 " not in text
    for block in text.split(" was stopped here:\n")[1:]:
        stack = block.split("\nrank ")[0]
        assert stack.count("in waits_for_its_peer") == 1, text
        assert "most recent call first" in stack
    assert not list(tmp_path.glob("launcher.log.stacks-*"))


def test_a_rank_on_another_host_writes_its_stacks_to_stderr(tmp_path):
    """The run's folder may not exist on another node: a rank there keeps the job's
    stderr, as before."""
    import os
    import signal
    import subprocess
    import sys

    from xbench.ranks import STACKS_ON_STOP, stacks_file_prefix

    where = f"not-{socket.gethostname()}:{stacks_file_prefix(tmp_path / 'launcher.log')}"
    waits = (
        "import time; from xbench.ranks import dump_stacks_when_stopped\n"
        "dump_stacks_when_stopped(); print('ready', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, STACKS_ON_STOP: where, "PMI_RANK": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", waits], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert b"most recent call first" in err and not list(tmp_path.iterdir())
