"""Record sites from a plain numpy model, and save / load dumps of site operands.

A model is a list of layers: :class:`Linear` (``y = x @ W.T + b``, ``W`` is N x K), :class:`ReLU`,
:class:`LayerNorm`, :class:`RMSNorm`. Each Linear is a site; its ``follow`` is the layer after it,
the first Linear is ``position="first"`` and the last ``"logit"``.

Dump format (what ``fp8lab probe`` / ``fp8lab dispatch`` read), either

- one ``.npz`` file with, per site ``NAME``, the arrays ``site/NAME/A`` (M x K), ``site/NAME/B``
  (N x K) and ``site/NAME/meta``: the site's attributes as UTF-8 JSON bytes (uint8 array:
  ``name``, ``m``, ``n``, ``k``, ``follow``, ``roles``, ``position``, ``cached``); or
- a folder with one ``NAME.npz`` (arrays ``A``, ``B``) per site and an optional ``NAME.json``
  beside it holding the attributes (missing attributes: ``follow="none"``, shapes from A and B).

>>> import numpy as np
>>> from fp8lab.loka.record import Linear, LayerNorm, ReLU, record_sites
>>> rng = np.random.default_rng(0)
>>> model = [Linear(rng.standard_normal((8, 4))), LayerNorm(), ReLU(), Linear(rng.standard_normal((2, 8)))]
>>> [(s.name, s.follow, s.position) for s, a, b in record_sites(model, rng.standard_normal((5, 4)))]
[('layer0', 'layernorm', 'first'), ('layer3', 'none', 'logit')]
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from .emulate import apply_follow
from .sites import Site

__all__ = ["Linear", "ReLU", "LayerNorm", "RMSNorm", "forward", "record_sites", "save_dump",
           "load_dump"]


@dataclasses.dataclass
class Linear:
    weight: np.ndarray  # N x K
    bias: np.ndarray | None = None

    def __call__(self, x):
        y = x @ self.weight.T
        return y if self.bias is None else y + self.bias


class ReLU:
    follow = "relu"

    def __call__(self, x):
        return np.maximum(x, 0)


class LayerNorm:
    follow = "layernorm"

    def __init__(self, eps: float = 1e-5):
        self.eps = eps

    def __call__(self, x):
        return apply_follow(x, "layernorm", self.eps)


class RMSNorm(LayerNorm):
    follow = "rmsnorm"

    def __call__(self, x):
        return apply_follow(x, "rmsnorm", self.eps)


def forward(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def record_sites(layers, x, *, prefix: str = "layer") -> list[tuple[Site, np.ndarray, np.ndarray]]:
    """Run ``x`` through ``layers``; return ``(site, A, B)`` for every Linear."""
    lin = [i for i, l in enumerate(layers) if isinstance(l, Linear)]
    out = []
    for i, layer in enumerate(layers):
        if isinstance(layer, Linear):
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            follow = getattr(nxt, "follow", "none") if not isinstance(nxt, Linear) else "none"
            pos = "first" if i == lin[0] else ("logit" if i == lin[-1] else "inner")
            w = np.asarray(layer.weight)
            a = np.asarray(x).reshape(-1, w.shape[1])
            out.append((Site(f"{prefix}{i}", a.shape[0], w.shape[0], w.shape[1], follow=follow,
                             position=pos), a.copy(), w))
        x = layer(x)
    return out


def save_dump(path, records) -> None:
    """Write ``[(site, A, B), ...]`` as one ``.npz`` (the first dump layout)."""
    arrays = {}
    for site, a, b in records:
        arrays[f"site/{site.name}/A"] = np.asarray(a)
        arrays[f"site/{site.name}/B"] = np.asarray(b)
        arrays[f"site/{site.name}/meta"] = np.frombuffer(json.dumps(site.to_dict()).encode(), np.uint8)
    np.savez(path, **arrays)


def _site_from(meta: dict, name: str, a, b) -> Site:
    d = {"name": name, "m": int(a.shape[0]), "n": int(b.shape[0]), "k": int(a.shape[1])}
    d.update(meta)
    return Site.from_dict(d)


def load_dump(path) -> list[tuple[Site, np.ndarray, np.ndarray]]:
    """Read a dump in either layout (see the module docstring)."""
    path = os.fspath(path)
    out = []
    if os.path.isdir(path):
        for fn in sorted(os.listdir(path)):
            if not fn.endswith(".npz"):
                continue
            name = fn[:-4]
            with np.load(os.path.join(path, fn), allow_pickle=False) as z:
                if "A" not in z or "B" not in z:
                    raise ValueError(f"{fn}: a site file needs arrays 'A' and 'B'")
                a, b = z["A"], z["B"]
            meta = {}
            js = os.path.join(path, name + ".json")
            if os.path.exists(js):
                with open(js, encoding="utf-8") as fh:
                    meta = json.load(fh)
            out.append((_site_from(meta, name, a, b), a, b))
    else:
        with np.load(path, allow_pickle=False) as z:
            names = sorted({k.split("/")[1] for k in z.files if k.startswith("site/")})
            for name in names:
                a, b = z[f"site/{name}/A"], z[f"site/{name}/B"]
                mk = f"site/{name}/meta"
                meta = json.loads(z[mk].tobytes().decode()) if mk in z.files else {}
                out.append((_site_from(meta, name, a, b), a, b))
    if not out:
        raise ValueError(f"{path}: no sites found (expected site/NAME/A keys or NAME.npz files)")
    return out
