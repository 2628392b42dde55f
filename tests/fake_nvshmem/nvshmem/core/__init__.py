"""``nvshmem.core`` on CPUs: UID init, symmetric tensors shared between two processes through
/dev/shm, finalize. See ../../README.md."""

from __future__ import annotations

import json
import mmap
import os
import time
import types

import numpy as np
import torch

WAIT_S = 60.0
state: dict = {}


class UniqueID:
    def __init__(self, data):
        self._data = data


def get_unique_id(empty=False) -> UniqueID:
    data = np.zeros(128, dtype=np.uint8)
    if not empty:
        data[:16] = np.frombuffer(os.urandom(16), dtype=np.uint8)
    return UniqueID(data)


def init(device=None, uid=None, rank=None, nranks=None, mpi_comm=None, initializer_method=""):
    if initializer_method != "uid" or uid is None or rank is None or nranks is None:
        raise RuntimeError(f"fake nvshmem: init wants uid, rank, nranks ({initializer_method!r})")
    if state:
        raise RuntimeError("fake nvshmem: init twice without finalize")
    tag = bytes(uid._data[:16]).hex()
    if tag == "00" * 16:
        raise RuntimeError("fake nvshmem: the unique ID never reached this PE")
    state.update(pe=rank, npes=nranks, prefix=f"/dev/shm/fake-nvshmem-{tag}", objects=[], next=0)
    log = os.environ.get("FAKE_NVSHMEM_LOG")
    state["log"] = open(f"{log}.{rank}", "a") if log else None  # noqa: SIM115
    _log({"init": {"pe": rank, "npes": nranks, "device": str(device)}})


def _log(entry: dict) -> None:
    if state.get("log"):
        state["log"].write(json.dumps(entry) + "\n")
        state["log"].flush()


def _require_init() -> None:
    if not state:
        raise RuntimeError("fake nvshmem: not initialized")


def _map(path: str, nbytes: int):
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def _allocate(nbytes: int) -> torch.Tensor:
    """Object k of this PE: a file of its own; returns once every PE has object k of the
    same size (allocation is collective), each peer's mapped here for puts."""
    _require_init()
    k = state["next"]
    state["next"] += 1
    size = max(nbytes, 1)
    path = f"{state['prefix']}-{state['pe']}-{k}"
    with open(path + ".tmp", "wb") as f:
        f.truncate(size)
    os.rename(path + ".tmp", path)  # whole, or not there
    mine = _map(path, size)
    peers = {}
    deadline = time.monotonic() + WAIT_S
    for pe in range(state["npes"]):
        if pe == state["pe"]:
            continue
        other = f"{state['prefix']}-{pe}-{k}"
        while not os.path.exists(other):
            if time.monotonic() > deadline:
                raise RuntimeError(f"fake nvshmem: PE {pe} never allocated object {k}")
            time.sleep(0.001)
        theirs = os.path.getsize(other)
        if theirs != size:
            raise RuntimeError(
                f"fake nvshmem: object {k} is {size} B on PE {state['pe']} and {theirs} B on "
                f"PE {pe}: symmetric allocations must match"
            )
        peers[pe] = torch.frombuffer(_map(other, size), dtype=torch.uint8)
    local = torch.frombuffer(mine, dtype=torch.uint8)
    state["objects"].append(
        {"k": k, "ptr": local.data_ptr(), "size": size, "local": local, "peers": peers,
         "path": path, "live": True}
    )  # fmt: skip
    return local[:nbytes] if nbytes else local[:0]


def find(ptr: int, nbytes: int, what: str) -> tuple[dict, int]:
    """The live symmetric object holding [ptr, ptr + nbytes), and the offset in it."""
    for obj in state["objects"]:
        if obj["ptr"] <= ptr < obj["ptr"] + obj["size"]:
            if not obj["live"]:
                raise RuntimeError(f"fake nvshmem: {what} is in freed object {obj['k']}")
            offset = ptr - obj["ptr"]
            if offset + nbytes > obj["size"]:
                raise RuntimeError(
                    f"fake nvshmem: {what} of {nbytes} B at offset {offset} runs past object "
                    f"{obj['k']} ({obj['size']} B)"
                )
            return obj, offset
    raise RuntimeError(f"fake nvshmem: {what} {ptr:#x} is not on the symmetric heap")


def _tensor(shape, dtype=torch.float32, release=False, morder="C", except_on_del=True):
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    raw = _allocate(n * torch.tensor([], dtype=dtype).element_size())
    return raw.view(dtype).view(tuple(shape))


def _bytetensor(shape, dtype=torch.float32, release=False, morder="C", except_on_del=True):
    return _allocate(int(np.prod(shape, dtype=np.int64)))


def _free_tensor(t: torch.Tensor) -> None:
    obj, offset = find(t.data_ptr(), 0, "freed tensor")
    if offset:
        raise RuntimeError("fake nvshmem: free_tensor takes the tensor the allocation returned")
    obj["live"] = False


interop = types.SimpleNamespace(
    torch=types.SimpleNamespace(tensor=_tensor, bytetensor=_bytetensor, free_tensor=_free_tensor)
)


def finalize() -> None:
    _require_init()
    live = [obj["k"] for obj in state["objects"] if obj["live"]]
    _log({"finalize": {"live": live}})
    for obj in state["objects"]:
        os.unlink(obj["path"])
    if state.get("log"):
        state["log"].close()
    state.clear()
