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
