"""One rank's program, shared by the CPU emulation and the NCCL path.

A :class:`RankProgram` holds one rank's state and, for each :class:`~.schedule.Step`, says what it
sends (:meth:`outgoing`) and what it does with what it receives (:meth:`incoming`). The emulation
runs N programs in lockstep and hands messages over in memory; the NCCL path runs one program per
process and moves the same bytes with ``ncclSend`` / ``ncclRecv``. Nothing else differs.

State: ``acc`` (float32, the rank's full-length vector: its input, to which reduce messages are
added) and ``wire`` (chunk -> (codes, scales), the gather phase's payloads, forwarded unchanged).

Accumulation order, for each received reduce message and each chunk in it, in step order::

    acc[chunk] = fl32(acc[chunk] + dequantize(message part))

so in the ring, chunk c at rank c+k holds ((x_{c+1} ~+ x_{c+2}) ~+ ...) ~+ x_{c+k}, where ``~+``
means "quantize the left operand, decode, add in float32"; in the tree, a rank adds its children's
subtree sums in increasing level order.

The gather phase quantizes each owner's finished chunk once (seed ``(seed, "gather", owner, 0)``);
every rank, the owner included, then decodes the same codes, so all ranks end with the same bits.
With one rank nothing is sent and nothing is quantized: the result is the input, exactly.
"""

from __future__ import annotations

from . import wire
from .schedule import Schedule, Step


class RankProgram:
    def __init__(self, xp, encode, decode, rank: int, sched: Schedule, bounds, comp, x):
        self.xp, self.encode, self.decode = xp, encode, decode
        self.rank, self.sched, self.bounds, self.comp = rank, sched, bounds, comp
        self.acc = x  # float32 1-D, owned (the caller passes a copy)
        self.wire: dict = {}

    def _chunk(self, c):
        return self.acc[self.bounds[c]:self.bounds[c + 1]]

    def sizes(self, chunks):
        return [self.bounds[c + 1] - self.bounds[c] for c in chunks]

    def nbytes(self, chunks) -> int:
        return self.comp.message_nbytes(self.sizes(chunks))

    def _own_payload(self):
        r = self.rank
        if r not in self.wire:
            seed = self.comp.message_seed("gather", r, 0)
            buf = wire.quantize_message(self.xp, self.encode, [self._chunk(r)], self.comp, seed)
            self.wire[r] = wire.unpack(self.xp, buf, self.sizes([r]), self.comp.block)[0]
        return self.wire[r]

    def outgoing(self, step: Step):
        """The packed uint8 message this rank sends at ``step`` (``None`` if it sends nothing)."""
        t = step.send_of(self.rank)
        if t is None:
            return None
        xp = self.xp
        if step.phase == "reduce":
            seed = self.comp.message_seed("reduce", self.rank, step.index)
            return wire.quantize_message(xp, self.encode, [self._chunk(c) for c in t.chunks],
                                         self.comp, seed)
        if self.rank in t.chunks:
            self._own_payload()
        parts = [self.wire[c] for c in t.chunks]
        codes = xp.concatenate([p[0] for p in parts])
        scales = xp.concatenate([p[1] for p in parts])
        return wire.pack(xp, codes, scales)

    def incoming(self, step: Step, buf) -> None:
        """Process the message received at ``step`` (``buf`` is this rank's own copy)."""
        t = step.recv_of(self.rank)
        if t is None:
            return
        parts = wire.unpack(self.xp, buf, self.sizes(t.chunks), self.comp.block)
        for c, (codes, scales) in zip(t.chunks, parts):
            if step.phase == "reduce":
                lo, hi = self.bounds[c], self.bounds[c + 1]
                self.acc[lo:hi] = self.acc[lo:hi] + wire.dequantize(self.xp, self.decode, codes,
                                                                    scales, self.comp)
            else:
                self.wire[c] = (codes, scales)

    def result(self):
        """Reduce-scatter: the rank's own chunk; all-gather / all-reduce: the full vector."""
        xp = self.xp
        if self.sched.op == "reduce_scatter":
            return self._chunk(self.rank).copy()
        if self.sched.ranks == 1:
            return self.acc.copy()
        self._own_payload()
        out = xp.empty(self.bounds[-1], dtype=xp.float32)
        for c in range(self.sched.ranks):
            codes, scales = self.wire[c]
            out[self.bounds[c]:self.bounds[c + 1]] = wire.dequantize(xp, self.decode, codes,
                                                                     scales, self.comp)
        return out
