"""Built-in demo tensors for ``fp8lab analyze --demo``: small, deterministic, and chosen to differ.

Each tensor shows a different way 8-bit formats fail, so that the analysis has something to say:

* ``weight.gaussian``: a linear layer's weight, N(0, 0.02^2). Well behaved: every format and
  recipe does about as well as its mantissa allows.
* ``act.outlier_channels``: activations with heavy (Student-t) tails and a few channels about
  60x larger than the rest, the pattern seen in transformer activations. One scale for the whole
  tensor wastes the range on the outliers; per-channel and per-block scales recover it.
* ``grad.tiny``: gradient-like values of magnitude ~1e-6 spread over ~30 binades (log-normal).
  Scaling moves the range, but not its width: the small tail underflows to zero in E4M3, less so
  in E5M2 and HiF8 whose ranges are wider.

The values come from :class:`numpy.random.Generator` (PCG64) with fixed seeds, so they are the
same on every machine.

>>> from fp8lab.demo_data import demo_tensors
>>> {name: x.shape for name, x in demo_tensors().items()}
{'weight.gaussian': (256, 512), 'act.outlier_channels': (128, 1024), 'grad.tiny': (256, 512)}
>>> float(demo_tensors()["weight.gaussian"][0, 0]) == float(demo_tensors()["weight.gaussian"][0, 0])
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["demo_tensors", "DEMO_NAMES"]

DEMO_NAMES = ("weight.gaussian", "act.outlier_channels", "grad.tiny")


def _weight(rng: np.random.Generator) -> np.ndarray:
    return (0.02 * rng.standard_normal((256, 512))).astype(np.float32)


def _activations(rng: np.random.Generator) -> np.ndarray:
    # Rows are tokens, columns channels. Student-t with 4 degrees of freedom has heavy tails;
    # 8 of the 1024 channels (fixed, spread out) carry a much larger magnitude.
    x = rng.standard_t(4, size=(128, 1024))
    outliers = np.arange(8) * 127 + 5
    x[:, outliers] *= 60.0
    return x.astype(np.float32)


def _tiny(rng: np.random.Generator) -> np.ndarray:
    # |x| = 1e-6 * exp(N(0, 3^2)): a spread of about +-13 binades around 1e-6.
    mag = 1e-6 * np.exp(3.0 * rng.standard_normal((256, 512)))
    sign = np.where(rng.random((256, 512)) < 0.5, -1.0, 1.0)
    return (sign * mag).astype(np.float32)


_MAKERS = {"weight.gaussian": (_weight, 1), "act.outlier_channels": (_activations, 2),
           "grad.tiny": (_tiny, 3)}


def demo_tensors() -> dict[str, np.ndarray]:
    """The demo tensors, name -> float32 array (about 0.4 M values in all)."""
    return {name: fn(np.random.default_rng(seed)) for name, (fn, seed) in _MAKERS.items()}
