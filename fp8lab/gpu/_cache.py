"""Bounded caches of device buffers that CUDA graphs can rely on.

fp8lab's GPU calls cache what they derive (tensor maps, workspaces, device copies of scalars,
launch plans) so that a repeated call costs no allocation and no host-to-device copy. The caches
are bounded: past ``limit`` entries they forget the old ones, and forgotten buffers go back to
CuPy's memory pool. A CUDA graph captured from fp8lab calls, however, keeps the raw device
addresses of the buffers those calls used; if a buffer were forgotten and its memory handed to
another array, replaying the graph would read or write the wrong memory. So an entry that is made
or used while the current stream is capturing a graph is kept for the life of the process (it is
never evicted): graphs are built deliberately and few, and what they use stays valid.
"""

from __future__ import annotations

__all__ = ["BoundedCache", "stream_capturing"]


def stream_capturing() -> bool:
    """Whether CuPy's current stream is capturing a CUDA graph (True when that cannot be told,
    e.g. the legacy stream queried while another stream captures: keeping an entry is safe)."""
    import cupy as cp
    s = cp.cuda.get_current_stream()
    try:
        return bool(s.is_capturing())
    except AttributeError:   # an older CuPy without Stream.is_capturing
        try:
            return cp.cuda.runtime.streamIsCapturing(s.ptr) != 0
        except Exception:  # noqa: BLE001
            return True
    except Exception:  # noqa: BLE001  (a CUDA error from the query itself)
        return True


class BoundedCache:
    """A dict bounded to ``limit`` entries whose entries made or used during graph capture are
    never evicted.

    ``capturing``: the predicate telling whether a graph is being captured now (default
    :func:`stream_capturing`; injectable for tests). When full, ``put`` drops every entry that
    is not kept, then stores the new one.

    >>> c = BoundedCache(2, capturing=lambda: False)
    >>> _ = c.put("a", 1); _ = c.put("b", 2); _ = c.put("c", 3)   # full: "a" and "b" dropped
    >>> sorted(c.keys())
    ['c']
    """

    def __init__(self, limit: int, capturing=None):
        self.limit = int(limit)
        self._capturing = capturing if capturing is not None else stream_capturing
        self._d: dict = {}
        self._kept: set = set()

    def get(self, key, default=None):
        v = self._d.get(key, default)
        if key in self._d and key not in self._kept and self._capturing():
            self._kept.add(key)
        return v

    def put(self, key, value):
        if key not in self._d and len(self._d) >= self.limit:
            self.evict()
        self._d[key] = value
        if key not in self._kept and self._capturing():
            self._kept.add(key)
        return value

    def evict(self) -> None:
        """Forget every entry that no captured graph uses."""
        self._d = {k: v for k, v in self._d.items() if k in self._kept}

    def kept(self) -> int:
        """How many entries are kept for captured graphs."""
        return len(self._kept)

    def keys(self):
        return self._d.keys()

    def __contains__(self, key) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)
