"""One training step of the DCNv2 MLP stack on an H200: Dispatch's kernel choices vs bf16 cuBLAS.

    PYTHONPATH=. python3 benchmarks/dlrm_step_gpu.py [--batch 8192] [--choices RESULT.json]
                                                      [--reps 20]

The stack is MLPerf DLRM-DCNv2's (``DLRMConfig.mlperf_dcnv2``): bottom MLP 13-512-256-128, three
cross layers of rank 512 on the 3456-wide interaction (V: 3456->512, U: 512->3456), top MLP
3456-1024-1024-512-256-1. One step = for every Linear its three GEMMs: forward ``X W^T``, input
gradient ``dY W`` (not for the first layer) and weight gradient ``dY^T X``. Element-wise work
(ReLU, LayerNorm, the cross layers' products), the embeddings and the optimizer are the same in
both variants and left out: the tables compare the GEMM work each variant adds.

- bf16: every GEMM a torch bf16 matmul (cuBLAS; transposed operands passed as views).
- LoKA: per site, the candidate Dispatch chose. ``high`` runs the same torch bf16 matmul; an
  8-bit candidate multiplies codes with :func:`fp8lab.gpu.gemm.gemm` (FP8 wgmma for e4m3/e5m2;
  HiF8 decoded to fp16). Choices come from ``--choices`` (the JSON of
  ``fp8lab dlrm --model mlperf-dcnv2 --json FILE``) or, without it, from the rule the CPU
  experiment's Dispatch arrived at (``docs/dlrm.md``): first and logit layers in bf16, every other
  GEMM e4m3 per-tensor.

Three ways to feed the operands, each timed for both variants:

- "operands ready": each GEMM's operands already in its compute format and layout, as when the
  producer of a tensor writes it in that format (fused casts): bf16 tensors (cuBLAS takes the
  transposed operands as views); 8-bit codes of X, W and dY and of their transposes (FP8 wgmma
  reads both operands K-major: ``X W^T``, ``dY^T (X^T)^T``, ``dY (W^T)^T``, all NT), each made
  once per layer, as a fused cast-and-transpose would.
- "casts from f32, current scaling": X, W and dY are float32; each is cast once per step
  (``.to(bfloat16)``; :func:`fp8lab.gpu.quantize.quantize` per format and scaling, which takes
  the tensor's maximum first, then :func:`fp8lab.gpu.gemm.transpose` of the codes where a
  transpose is needed), and the casts are timed with the GEMMs.
- "casts from f32, delayed scaling": as above, but each per-tensor operand is cast by
  :func:`fp8lab.gpu.quantize.cast_transpose` at a scale held on the device (codes, transposed
  codes and the running maximum in one pass), and the step ends with the next scales computed
  from the maxima on the device (:func:`fp8lab.gpu.quantize.scales_from_amax`), as FP8
  training with delayed scaling does. (Per-row candidates keep the current-scaling path.)

Each step is timed eagerly (Python launching every kernel, as a training loop without graphs
does) and as a CUDA graph captured from the same calls and replayed (launch costs removed: the
GPU's own time). Per-site times come from graphs of ten calls of one site. A third column, "LoKA +
GPU times", applies Dispatch's rule (the fastest option that meets the error budget; bf16 always
does) with those per-site times: an 8-bit site slower than bf16 on this GPU runs bf16. Prints the
tables and the speed-ups; the target of issue 8 is >= 1.2x. Needs CuPy, an sm_90 GPU
(fp8lab.gpu.available()) and torch (baseline and graph capture only); without them it says what
is missing and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys


def _layers():
    """(name, n_in, n_out, position) of the MLPerf DCNv2 MLP stack."""
    out, n = [], 13
    for i, w in enumerate((512, 256, 128)):
        out.append((f"bottom.{i}", n, w, "first" if i == 0 else "inner"))
        n = w
    for i in range(3):
        out.append((f"cross.{i}.v", 3456, 512, "inner"))
        out.append((f"cross.{i}.u", 512, 3456, "inner"))
    n = 3456
    for i, w in enumerate((1024, 1024, 512, 256)):
        out.append((f"top.{i}", n, w, "inner"))
        n = w
    out.append(("top.4", n, 1, "logit"))
    return out


def _default_choice(name: str, position: str) -> str:
    if position in ("first", "logit"):
        return "high"
    return "e4m3/e4m3:tensor"


def _cupy_stream(cp, torch_stream):
    """A CuPy stream object for a torch stream (launches go to the same CUDA stream)."""
    if hasattr(cp.cuda.Stream, "from_external"):
        return cp.cuda.Stream.from_external(torch_stream)
    return cp.cuda.ExternalStream(torch_stream.cuda_stream)


def capture_graph(cp, torch, fn, n=1):
    """A CUDA graph of ``n`` calls of ``fn`` (torch's capture stream; CuPy launches on it)."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with _cupy_stream(cp, side):
            fn()   # warm-up on the capture stream (plans, tensor maps, pool blocks)
            side.synchronize()
            with torch.cuda.graph(graph, stream=side, capture_error_mode="relaxed"):
                with _cupy_stream(cp, torch.cuda.current_stream()):
                    for _ in range(n):
                        fn()
    torch.cuda.synchronize()
    return graph


def _need():
    try:
        import fp8lab.gpu as G
    except Exception as exc:  # noqa: BLE001
        return f"fp8lab.gpu does not import ({exc})"
    ok, why = G.available()
    if not ok:
        return f"no usable GPU: {why}"
    try:
        import torch
    except ImportError:
        return "torch is needed for the bf16 cuBLAS baseline (pip install torch)"

    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--choices", metavar="JSON", help="result JSON of fp8lab dlrm (LoKA runs)")
    args = ap.parse_args(argv)
    why = _need()
    if why:
        print(f"dlrm_step_gpu: cannot run here: {why}. This benchmark needs an H200 (sm_90) with "
              "CuPy and torch.", file=sys.stderr)
        return 1
    import cupy as cp
    import torch

    from fp8lab.gpu.gemm import gemm, transpose
    from fp8lab.gpu.quantize import cast_transpose, quantize, scales_from_amax
    from fp8lab.loka.sites import Candidate
    from fp8lab.scaling import Scaling

    choices = {}
    if args.choices:
        with open(args.choices, encoding="utf-8") as fh:
            res = json.load(fh)
        run = next(r for r in res["runs"] if r["mode"] == "loka")
        choices = run["choices"]
    B = args.batch
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.float32)

    layers = []   # (name, position, {"x", "w", "dy"} float32, [(kind, candidate)])
    for name, n_in, n_out, pos in _layers():
        t = {"x": randn(B, n_in), "w": randn(n_out, n_in) * n_in ** -0.5, "dy": randn(B, n_out)}
        kinds = ["fwd", "dw"] + ([] if pos == "first" else ["dx"])
        layers.append((name, pos, t, [(k, Candidate.parse(choices.get(f"{name}.{k}",
                                                                      _default_choice(name, pos))))
                                      for k in kinds]))
    # operands per GEMM kind, all NT (C = A B^T, both K-major as FP8 wgmma reads them):
    # (A tensor, A orientation, B tensor, B orientation); "t" = the tensor's codes transposed
    ROLES = {"fwd": ("x", "", "w", ""), "dw": ("dy", "t", "x", "t"), "dx": ("dy", "", "w", "t")}

    def scaling_of(cand, orient):
        """(Scaling, gemm scaling name) of an operand of a candidate: per-row scales of the
        operand as the GEMM reads it (per column of the tensor when transposed)."""
        if cand.scaling == "tensor":
            return Scaling.per_tensor(), "tensor"
        return Scaling.per_channel(axis=0 if orient == "t" else -1), "row_col"

    def bf16_site(t16, kind):
        x, w, dy = t16["x"], t16["w"], t16["dy"]
        return {"fwd": lambda: x @ w.t(), "dw": lambda: dy.t() @ x, "dx": lambda: dy @ w}[kind]

    # delayed scaling on the device: per format, one slot per (layer, tensor) in an amax array
    # and a scale array; each cast reads its scale and raises its running maximum; at the end of
    # the step the next scales come from the maxima (scales_from_amax) and the maxima restart.
    slots, dl_amax, dl_scale = {}, {}, {}

    def delayed_slot(layer, name, fmt, x32):
        key = (layer, name, fmt)
        if key not in slots:
            slots[key] = len([k for k in slots if k[2] == fmt])
            a = cp.abs(cp.from_dlpack(x32)).max().reshape(1)   # the "previous step's" maximum
            dl_amax[fmt] = cp.concatenate([dl_amax.get(fmt, cp.zeros(0, cp.float32)), a])
            dl_scale[fmt] = scales_from_amax(dl_amax[fmt], fmt)
        i = slots[key]
        return dl_scale[fmt][i:i + 1], dl_amax[fmt][i:i + 1]

    def rescale():
        for fmt, amax in dl_amax.items():
            dl_scale[fmt][...] = scales_from_amax(amax, fmt)
            amax.fill(0)

    class Codes:
        """One step's 8-bit operands: each (tensor, format, scaling, orientation) cast once.
        ``delayed``: per-tensor casts by cast_transpose at the delayed scale (codes and their
        transpose in one pass); else quantize (current scaling: a maximum pass first) and
        transpose."""

        def __init__(self, layer, t32, delayed=False):
            self.layer, self.t32, self.q, self.delayed = layer, t32, {}, delayed

        def get(self, name, fmt, sc, orient):
            key = (name, fmt, repr(sc), orient)
            if key not in self.q and self.delayed and sc.kind == "tensor":
                s, amax = delayed_slot(self.layer, name, fmt, self.t32[name])
                ct = cast_transpose(cp.from_dlpack(self.t32[name]), fmt, s, saturate=True, amax=amax,
                                    check=False)
                self.q[key[:3] + ("",)] = (ct.q.codes, ct.q.scales.ravel())
                self.q[key[:3] + ("t",)] = (ct.t, ct.q.scales.ravel())
            if key not in self.q:
                if orient == "t":   # cast the tensor, transpose its codes (one launch)
                    q = self.get(name, fmt, sc, "")
                    self.q[key] = (transpose(q[0]), q[1])
                else:
                    q = quantize(cp.from_dlpack(self.t32[name]), fmt, scaling=sc, saturate=True)
                    self.q[key] = (q.codes, q.scales.ravel())
            return self.q[key]

    def fp8_site(codes, cand, kind, out):
        an, ao, bn, bo = ROLES[kind]
        sa, gs = scaling_of(cand, ao)
        sb, _ = scaling_of(cand, bo)

        def call():
            a, a_s = codes.get(an, cand.fmt_a, sa, ao)
            b, b_s = codes.get(bn, cand.fmt_b, sb, bo)
            return gemm(a, b, cand.fmt_a, cand.fmt_b, scale_a=a_s, scale_b=b_s, scaling=gs,
                        layout="nt", out_dtype="bfloat16", out=out)
        return call

    def shape_of(t, kind):
        M = t["dy"].shape[1] if kind == "dw" else t["x"].shape[0]
        N = {"fwd": t["w"].shape[0], "dw": t["x"].shape[1], "dx": t["w"].shape[1]}[kind]
        K = {"fwd": t["x"].shape[1], "dw": B, "dx": t["w"].shape[0]}[kind]
        return M, N, K

    outs = {}

    def out_of(name, kind, t):
        key = (name, kind)
        if key not in outs:
            M, N, _ = shape_of(t, kind)
            outs[key] = cp.empty((M, N), cp.uint16)
        return outs[key]

    def step_fns(variant, ready, high=frozenset(), delayed=False):
        """The callables of one step, in order. ``ready``: operands made beforehand (not timed);
        ``high``: (layer, kind) sites run in bf16 whatever their candidate; ``delayed``: casts
        from float32 at delayed per-tensor scales (cast_transpose), the next scales computed at
        the end of the step."""
        fns, keep = [], []
        for name, pos, t, sites in layers:
            t16 = ({k: v.to(torch.bfloat16) for k, v in t.items()} if ready else None)
            codes = Codes(name, t, delayed and not ready)
            if not ready:
                # casts inside the step: bf16 tensors (once per step) and 8-bit codes (on demand)
                holder = {}

                def cast16(t=t, holder=holder):
                    holder.update({k: v.to(torch.bfloat16) for k, v in t.items()})
                if variant == "bf16" or any(c.is_high or (name, k) in high for k, c in sites):
                    fns.append(cast16)

                def reset(codes=codes):
                    codes.q.clear()
                fns.append(reset)
            for kind, cand in sites:
                if variant == "bf16" or cand.is_high or (name, kind) in high:
                    if ready:
                        fns.append(bf16_site(t16, kind))
                    else:
                        fns.append(lambda kind=kind, holder=holder: bf16_site(holder, kind)())
                else:
                    f = fp8_site(codes, cand, kind, out_of(name, kind, t))
                    if ready:
                        f()   # makes the codes now (kept by ``codes``); the step only multiplies
                    fns.append(f)
            keep.append(codes)
        if delayed and not ready and variant != "bf16":
            fns.append(rescale)
        return fns, keep

    def run_all(fns):
        res = None
        for f in fns:
            res = f()
        return res

    def time_events(fn, reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(reps):
            start.record()
            fn()
            end.record()
            end.synchronize()
            ts.append(start.elapsed_time(end))
        ts.sort()
        return ts[len(ts) // 2]

    def capture(fn, n=1):
        return capture_graph(cp, torch, fn, n)

    def timed(fns):
        """(eager step ms, graph step ms)."""
        step = lambda: run_all(fns)
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        cp.cuda.Device().synchronize()
        eager = time_events(step, args.reps)
        try:
            graph = capture(step)
            gt = time_events(graph.replay, args.reps)
        except Exception as exc:  # noqa: BLE001
            print(f"  graph capture failed: {type(exc).__name__}: {exc}")
            gt = float("nan")
        return eager, gt

    print(f"DCNv2 MLP stack, batch {B}, one training step's GEMMs, H200 (median of {args.reps}, ms)")
    # per-site GPU times (operands ready; graphs of ten calls)
    print(f"{'site':18} {'M x N x K':>20} {'choice':24} {'bf16':>8} {'LoKA':>8}   (GPU time per call, graph of 10 calls)")
    tot_b = tot_l = tot_d = 0.0
    slower = set()   # 8-bit sites slower than bf16 on this GPU
    fb, keep_b = step_fns("bf16", True)
    fl, keep_l = step_fns("loka", True)
    i = 0
    for name, pos, t, sites in layers:
        # the step lists hold one callable per site in the same order (no casts when ready)
        for kind, cand in sites:
            M, N, K = shape_of(t, kind)
            tb_ = time_events(capture(fb[i], 10).replay, args.reps) / 10
            tl_ = tb_ if cand.is_high else time_events(capture(fl[i], 10).replay, args.reps) / 10
            tot_b += tb_
            tot_l += tl_
            tot_d += min(tb_, tl_)
            if tl_ >= tb_ and not cand.is_high:
                slower.add((name, kind))
            print(f"{name + '.' + kind:18} {f'{M}x{N}x{K}':>20} {cand.label:24} {tb_:8.4f} {tl_:8.4f}")
            i += 1
    print(f"{'sum over sites':64} {tot_b:8.3f} {tot_l:8.3f}   speed-up {tot_b / tot_l:.2f}x; "
          f"faster of the two per site {tot_d:.3f} ({tot_b / tot_d:.2f}x)")
    print(f"8-bit sites slower than bf16 here ({len(slower)}): "
          + (", ".join(f"{n}.{k}" for n, k in sorted(slower)) or "none"))
    print()
    # "LoKA": the CPU experiment's choices as they are. "LoKA + GPU times": Dispatch's rule (the
    # fastest option that meets the error budget; bf16 always does) with the per-site times
    # measured above on this GPU: 8-bit sites slower than bf16 here run bf16.
    rows = []
    for ready, delayed, label in ((True, False, "operands ready (fused casts)"),
                                  (False, False, "casts from f32, current scaling"),
                                  (False, True, "casts from f32, delayed scaling")):
        res = []
        for variant, high in (("bf16", frozenset()), ("loka", frozenset()), ("loka", frozenset(slower))):
            fns, keep = step_fns(variant, ready, high, delayed)
            res.append(timed(fns))
            del fns, keep
        rows.append((label, res))
    print(f"{'whole step (ms)':32} {'':>6} {'bf16':>8} {'LoKA':>8} {'speed-up':>9} {'LoKA+GPU times':>15} {'speed-up':>9}")
    for label, res in rows:
        for j, how in enumerate(("eager", "graph")):
            b, l, d = (r[j] for r in res)
            print(f"{label:32} {how:>6} {b:8.3f} {l:8.3f} {b / l:8.2f}x {d:15.3f} {b / d:8.2f}x")
    b, l, d = (r[1] for r in rows[0][1])
    for name, t in (("LoKA's choices", l), ("LoKA's choices with Dispatch timed on this GPU", d)):
        sp = b / t
        print(f"speed-up of {name} over bf16 cuBLAS, one step as a CUDA graph, operands ready: "
              f"{sp:.2f}x (target >= 1.2x: {'met' if sp >= 1.2 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
