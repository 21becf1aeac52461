"""The quantized collectives on GPUs through NCCL (``cupy.cuda.nccl``), one process per GPU.

Each process runs the same per-rank program as the CPU emulation (:mod:`._engine`) over the same
step list; the messages (uint8 codes, padding, float32 scales: :mod:`.wire`) move with
``ncclSend`` / ``ncclRecv`` grouped per step, on the current CuPy stream, so the encode and decode
kernels and the transfers are ordered by the stream alone. The codecs are :mod:`fp8lab.gpu`'s,
bit-identical to the CPU ones; hence ``nccl.all_reduce`` on rank r returns the bits that
``emulate.all_reduce`` computes for rank r.

CuPy is imported on first use: importing this module needs neither CuPy nor a GPU.

Typical use, in each of N processes (``launch`` does this with ``multiprocessing``)::

    comm = nccl.init(rank, world, uid)              # uid = nccl.unique_id() from one process
    g = nccl.all_reduce(grad, comm, Compression("e4m3", block=128))

>>> from fp8lab.collectives import nccl
>>> ok, why = nccl.available()
>>> isinstance(ok, bool) and isinstance(why, str)
True
"""

from __future__ import annotations

import os

from ._engine import RankProgram
from .schedule import ALGOS, build_schedule, chunk_bounds
from .wire import Compression

__all__ = ["available", "unique_id", "init", "all_reduce", "reduce_scatter", "all_gather",
           "all_reduce_nccl", "launch", "NCCL_BFLOAT16", "NCCL_FLOAT32"]

# ncclDataType_t values (nccl.h); bfloat16 is missing from older cupy.cuda.nccl enums
NCCL_UINT8, NCCL_FLOAT32, NCCL_BFLOAT16, NCCL_SUM = 1, 7, 9, 0


def _cupy():
    import cupy
    return cupy


def _nccl():
    from cupy.cuda import nccl
    return nccl


def available(world: int = 1) -> tuple[bool, str]:
    """``(True, description)`` if ``world`` processes, one per GPU, can run here, else
    ``(False, why not)``."""
    from .. import gpu

    ok, why = gpu.available()
    if not ok:
        return False, why
    try:
        nccl = _nccl()
        version = nccl.get_version()
    except Exception as exc:  # ImportError, or CuPy built without NCCL
        return False, f"cupy.cuda.nccl is not usable ({type(exc).__name__}: {exc})"
    n = _cupy().cuda.runtime.getDeviceCount()
    if n < world:
        return False, f"{world} GPUs needed, {n} found"
    return True, f"NCCL {version}, {n} GPU(s); {why}"


def unique_id():
    """A new NCCL unique id (a tuple of 128 ints): create it once, pass it to every rank."""
    return _nccl().get_unique_id()


def init(rank: int, world: int, uid, device: int | None = None):
    """Select this process's GPU (``device``, default ``rank``) and join the communicator."""
    cp = _cupy()
    cp.cuda.Device(rank if device is None else device).use()
    return _nccl().NcclCommunicator(world, uid, rank)


def _check(x, comp, algo):
    cp = _cupy()
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"expected a CuPy array on this rank's GPU, got {type(x).__name__}; "
                        f"use fp8lab.collectives.emulate for NumPy arrays")
    if x.dtype.name not in ("float32", "float16"):
        raise TypeError(f"expected float32 or float16, got {x.dtype.name}")
    if comp is None:
        comp = Compression()
    if not isinstance(comp, Compression):
        raise TypeError(f"compression must be a Compression, got {type(comp).__name__}")
    if algo not in ALGOS:
        raise ValueError(f"unknown algorithm {algo!r}; known: {', '.join(ALGOS)}")
    return comp


def _run(op, flat, n, comm, comp, algo):
    cp, nccl = _cupy(), _nccl()
    from ..gpu.codecs import decode, encode

    rank, world = comm.rank_id(), comm.size()
    sched = build_schedule(op, algo, world)
    bounds = chunk_bounds(n, world, comp.block)
    prog = RankProgram(cp, encode, decode, rank, sched, bounds, comp, flat)
    stream = cp.cuda.get_current_stream().ptr
    for step in sched.steps:
        buf = prog.outgoing(step)
        send, recv = step.send_of(rank), step.recv_of(rank)
        rbuf = cp.empty(prog.nbytes(recv.chunks), cp.uint8) if recv is not None else None
        # one group per step: the send and the receive of a rank progress together (a ring of
        # blocking sends would deadlock)
        nccl.groupStart()
        if buf is not None and buf.size:
            comm.send(buf.data.ptr, buf.size, NCCL_UINT8, send.dst, stream)
        if rbuf is not None and rbuf.size:
            comm.recv(rbuf.data.ptr, rbuf.size, NCCL_UINT8, recv.src, stream)
        nccl.groupEnd()
        prog.incoming(step, rbuf)
    return prog.result()


def all_reduce(x, comm, compression: Compression | None = None, *, algo: str = "ring"):
    """Quantized all-reduce (sum) of this rank's ``x``; returns float32 of ``x``'s shape."""
    comp = _check(x, compression, algo)
    flat = x.astype("float32").reshape(-1).copy()
    return _run("all_reduce", flat, flat.size, comm, comp, algo).reshape(x.shape)


def reduce_scatter(x, comm, compression: Compression | None = None, *, algo: str = "ring"):
    """Quantized reduce-scatter: this rank's chunk of the sum (1-D float32, see
    :func:`~fp8lab.collectives.schedule.chunk_bounds`)."""
    comp = _check(x, compression, algo)
    flat = x.astype("float32").reshape(-1).copy()
    return _run("reduce_scatter", flat, flat.size, comm, comp, algo)


def all_gather(chunk, n: int, comm, compression: Compression | None = None, *, algo: str = "ring"):
    """Quantized all-gather of each rank's chunk of an ``n``-element vector (1-D float32)."""
    cp = _cupy()
    comp = _check(chunk, compression, algo)
    rank, world = comm.rank_id(), comm.size()
    b = chunk_bounds(n, world, comp.block)
    if chunk.size != b[rank + 1] - b[rank]:
        raise ValueError(f"rank {rank}'s chunk has {chunk.size} elements; the layout of {n} "
                         f"elements on {world} ranks with block {comp.block} expects "
                         f"{b[rank + 1] - b[rank]}")
    flat = cp.zeros(n, cp.float32)
    flat[b[rank]:b[rank + 1]] = chunk.astype(cp.float32).reshape(-1)
    return _run("all_gather", flat, n, comm, comp, algo)


def all_reduce_nccl(x, comm, *, datatype: int = NCCL_BFLOAT16, out=None):
    """NCCL's own all-reduce (sum) of ``x`` in place (or into ``out``): the baseline.

    bfloat16 tensors are passed as their uint16 bit patterns (CuPy has no bfloat16 dtype).
    """
    cp = _cupy()
    out = x if out is None else out
    comm.allReduce(x.data.ptr, out.data.ptr, x.size, datatype, NCCL_SUM,
                   cp.cuda.get_current_stream().ptr)
    return out


def _worker(rank, world, uid, fn, args, queue):
    try:
        comm = init(rank, world, uid)
        queue.put((rank, True, fn(rank, comm, *args)))
    except BaseException as exc:  # report, so the parent does not wait forever
        import traceback
        queue.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def launch(fn, world: int, *args, timeout: float = 600.0) -> list:
    """Run ``fn(rank, comm, *args)`` in ``world`` processes, one per GPU; return the results
    in rank order (``fn`` and its results must pickle). NVLink multicast (NVLS) is turned off
    (``NCCL_NVLS_ENABLE=0``) before any process starts."""
    import multiprocessing as mp
    import queue as queue_mod

    ok, why = available(world)
    if not ok:
        raise RuntimeError(f"cannot run {world} NCCL ranks here: {why}")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    ctx = mp.get_context("spawn")  # CUDA cannot be used in forked children
    uid = unique_id()
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, uid, fn, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict = {}
    try:
        while len(results) < world:
            try:
                rank, ok, value = q.get(timeout=timeout)
            except queue_mod.Empty:
                raise RuntimeError(f"NCCL ranks timed out after {timeout} s; finished: "
                                   f"{sorted(results)}") from None
            if not ok:
                raise RuntimeError(f"rank {rank} failed: {value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return [results[r] for r in range(world)]
