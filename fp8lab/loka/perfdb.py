"""The performance database: measured seconds per (kernel, shape bucket, device).

Stored as JSON, written atomically (a temporary file in the same folder, flushed and fsynced, then
``os.replace``), so a crash never leaves a half-written database. A missing or corrupt file is
rebuilt with a warning: entries are re-measured when first needed. Only measured times are stored;
a kernel whose device is absent gets no entry.

Shape buckets round each dimension up to a power of two, and the time stored is measured at that
rounded shape (an upper bound for every shape in the bucket).

>>> from fp8lab.loka.perfdb import bucket
>>> bucket((100, 64, 3000))
(128, 64, 4096)
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
import warnings

import numpy as np

__all__ = ["PerfDB", "bucket", "device_name", "time_call"]

VERSION = 1


def bucket(shape) -> tuple[int, ...]:
    return tuple(1 << max(0, int(d - 1).bit_length()) for d in shape)


def device_name() -> str:
    return f"cpu:{platform.machine() or 'unknown'}:{os.cpu_count()}c"


def time_call(fn, *, min_time: float = 0.05, max_reps: int = 50) -> float:
    """Median seconds of ``fn()`` after one warm-up call, repeated until ``min_time`` passes."""
    fn()
    ts = []
    start = time.perf_counter()
    while len(ts) < max_reps and (len(ts) < 3 or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


class PerfDB:
    """Measured kernel times, persisted at ``path`` (``None``: in memory only)."""

    def __init__(self, path=None, *, autosave: bool = True):
        self.path = None if path is None else os.fspath(path)
        self.autosave = autosave
        self.entries: dict[str, dict] = {}
        self.rebuilt = False
        if self.path is not None:
            self._load()

    @staticmethod
    def key(kernel: str, shape, device: str) -> str:
        return f"{kernel}|{'x'.join(map(str, bucket(shape)))}|{device}"

    def _load(self) -> None:
        if not os.path.exists(self.path):
            warnings.warn(f"perf database {self.path} is missing; rebuilding it (kernels are "
                          "re-measured when first needed)", RuntimeWarning, stacklevel=3)
            self.rebuilt = True
            return
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"unknown layout (version {data.get('version') if isinstance(data, dict) else None})")
            entries = data["entries"]
            for k, v in entries.items():
                if not (isinstance(k, str) and k.count("|") == 2 and isinstance(v, dict)
                        and isinstance(v.get("seconds"), (int, float)) and v["seconds"] > 0):
                    raise ValueError(f"bad entry {k!r}")
            self.entries = dict(entries)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            warnings.warn(f"perf database {self.path} is corrupt ({exc}); rebuilding it",
                          RuntimeWarning, stacklevel=3)
            self.entries = {}
            self.rebuilt = True

    def save(self) -> None:
        if self.path is None:
            return
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".perfdb-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": VERSION, "entries": self.entries}, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def get(self, kernel: str, shape, device: str) -> float | None:
        e = self.entries.get(self.key(kernel, shape, device))
        return None if e is None else float(e["seconds"])

    def put(self, kernel: str, shape, device: str, seconds: float, reps: int = 0) -> None:
        if not seconds > 0:
            raise ValueError("a measured time must be positive")
        self.entries[self.key(kernel, shape, device)] = {
            "seconds": float(seconds), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "reps": reps}
        if self.autosave:
            self.save()

    def measure(self, kernel: str, shape, device: str, fn) -> float:
        """Time ``fn`` (a no-argument callable running at the bucket shape) and store it."""
        t = time_call(fn)
        self.put(kernel, shape, device, t)
        return t
