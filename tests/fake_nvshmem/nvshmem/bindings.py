"""``nvshmem.bindings``' host-initiated, on-stream RMA on CPUs: puts move the bytes into the
peer's mapping of the object at once (quiet has nothing left to wait for); a wait spins on the
local word. See ../README.md."""

from __future__ import annotations

import ctypes
import time

from nvshmem.core import WAIT_S, _log, _require_init, find, state

SIGNAL_SET, SIGNAL_ADD, CMP_GE = 9, 10, 5


def _check_stream(stream) -> None:
    if not isinstance(stream, int):
        raise TypeError(f"fake nvshmem: a stream is a handle (int), not {type(stream).__name__}")


def _peer_address(ptr: int, nbytes: int, pe: int, what: str) -> int:
    if pe == state["pe"] or not 0 <= pe < state["npes"]:
        raise RuntimeError(f"fake nvshmem: PE {pe} is not a peer of PE {state['pe']}")
    obj, offset = find(ptr, nbytes, what)
    return obj["peers"][pe].data_ptr() + offset


def _put(dest: int, source: int, nbytes: int, pe: int) -> None:
    find(source, nbytes, "a put's source")  # a remote transport's NIC reads registered memory
    ctypes.memmove(_peer_address(dest, nbytes, pe, "a put's destination"), source, nbytes)


def _signal(sig_addr: int, value: int, op: int, pe: int) -> None:
    word = ctypes.c_int64.from_address(_peer_address(sig_addr, 8, pe, "a signal word"))
    if op == SIGNAL_SET:
        word.value = value
    elif op == SIGNAL_ADD:
        word.value += value
    else:
        raise ValueError(f"fake nvshmem: signal op {op} is neither SET (9) nor ADD (10)")


def putmem_signal_on_stream(dest, source, nbytes, sig_addr, signal, sig_op, pe, cstrm):
    _require_init()
    _check_stream(cstrm)
    _put(dest, source, nbytes, pe)
    _signal(sig_addr, signal, sig_op, pe)
    _log({"put_signal": [nbytes, signal, pe]})


def putmem_nbi_on_stream(dest, source, nbytes, pe, cstrm):
    _require_init()
    _check_stream(cstrm)
    _put(dest, source, nbytes, pe)
    _log({"put_nbi": [nbytes, pe]})


def quiet_on_stream(cstrm):
    _check_stream(cstrm)
    _log({"quiet": []})


def signal_op_on_stream(sig_addr, signal, sig_op, pe, cstrm):
    _require_init()
    _check_stream(cstrm)
    _signal(sig_addr, signal, sig_op, pe)
    _log({"signal": [signal, pe]})


def signal_wait_until_on_stream(sig_addr, cmp, cmp_value, cstream):
    _require_init()
    _check_stream(cstream)
    if cmp != CMP_GE:
        raise ValueError(f"fake nvshmem: only CMP_GE (5) is modelled, got {cmp}")
    find(sig_addr, 8, "a signal word")
    word = ctypes.c_int64.from_address(sig_addr)
    deadline = time.monotonic() + WAIT_S
    while word.value < cmp_value:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fake nvshmem: signal stayed at {word.value} < {cmp_value}")
        time.sleep(0)
    _log({"wait": [cmp_value]})
