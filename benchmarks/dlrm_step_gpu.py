"""One training step of the DCNv2 MLP stack on an H200: Dispatch's kernel choices vs bf16 cuBLAS.

    PYTHONPATH=. python3 benchmarks/dlrm_step_gpu.py [--batch 8192] [--choices RESULT.json]
                                                      [--reps 20]

The stack is MLPerf DLRM-DCNv2's (``DLRMConfig.mlperf_dcnv2``): bottom MLP 13-512-256-128, three
cross layers of rank 512 on the 3456-wide interaction (V: 3456->512, U: 512->3456), top MLP
3456-1024-1024-512-256-1. One step = for every Linear its three GEMMs: forward ``X W^T``, input
gradient ``dY W`` (not for the first layer) and weight gradient ``dY^T X``. Element-wise work
(ReLU, LayerNorm, the cross layers' products), the embeddings and the optimizer are the same in
both variants and left out: the table compares the GEMM work each variant adds.

- baseline: every GEMM a torch bf16 matmul (cuBLAS), bf16 operands already in memory.
- LoKA: per site, the candidate Dispatch chose. ``high`` runs the same torch bf16 matmul; an
  8-bit candidate casts each operand with :func:`fp8lab.gpu.quantize.quantize` (from float32; the
  cast is timed, it is not fused yet) and multiplies with :func:`fp8lab.gpu.gemm.gemm`
  (FP8 wgmma for e4m3/e5m2; HiF8 decoded to fp16). Choices come from ``--choices`` (the JSON of
  ``fp8lab dlrm --model mlperf-dcnv2 --json FILE``) or, without it, from the rule the CPU
  experiment's Dispatch arrived at (``docs/dlrm.md``): first and logit layers in bf16, every other
  forward GEMM e4m3 per-tensor, every gradient GEMM e4m3 per-tensor.

Prints a table per site (ms, bf16 vs LoKA), the step totals and the speed-up; the target of
issue 8 is >= 1.2x. Needs CuPy, an sm_90 GPU (fp8lab.gpu.available()) and torch (baseline only);
without them it says what is missing and exits with status 1.
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


def _need():
    try:
        import fp8lab.gpu as G
    except Exception as exc:  # noqa: BLE001
        return f"fp8lab.gpu does not import ({exc})"
    ok, why = G.available()
    if not ok:
        return f"no usable GPU: {why}"
    try:
        import torch  # noqa: F401
    except ImportError:
        return "torch is needed for the bf16 cuBLAS baseline (pip install torch)"
    import torch

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

    from fp8lab.gpu.gemm import gemm
    from fp8lab.gpu.quantize import quantize
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

    sites = []  # (site name, kind, A fp32 (M,K) row-major, B fp32, layout, candidate)
    for name, n_in, n_out, pos in _layers():
        x, w, dy = randn(B, n_in), randn(n_out, n_in) * n_in ** -0.5, randn(B, n_out)
        gemms = [("fwd", x, w, "nt"), ("dw", dy.t().contiguous(), x, "nn")]
        if pos != "first":
            gemms.append(("dx", dy, w, "nn"))
        for kind, a, b, layout in gemms:
            site = f"{name}.{kind}"
            label = choices.get(site, _default_choice(name, pos))
            sites.append((site, a, b, layout, Candidate.parse(label)))

    def bf16_call(a, b, layout):
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        return (lambda: a16 @ b16.t()) if layout == "nt" else (lambda: a16 @ b16)

    def fp8_call(a, b, layout, cand):
        ac, bc = cp.from_dlpack(a), cp.from_dlpack(b)
        if cand.scaling == "tensor":
            sa, sb, gs = Scaling.per_tensor(), Scaling.per_tensor(), "tensor"
        else:  # one scale per row of A and per output column of B
            sa = Scaling.per_channel(axis=-1)
            sb = Scaling.per_channel(axis=-1 if layout == "nt" else 0)
            gs = "row_col"

        out = cp.empty((ac.shape[0], bc.shape[0] if layout == "nt" else bc.shape[1]), cp.uint16)

        def mm(qa, qb):   # scales stay on the device (no host round trip)
            return gemm(qa.codes, qb.codes, cand.fmt_a, cand.fmt_b, scale_a=qa.scales.ravel(),
                        scale_b=qb.scales.ravel(), scaling=gs, layout=layout,
                        out_dtype="bfloat16", out=out)

        def run():
            return mm(quantize(ac, cand.fmt_a, scaling=sa, saturate=True),
                      quantize(bc, cand.fmt_b, scaling=sb, saturate=True))
        qa0 = quantize(ac, cand.fmt_a, scaling=sa, saturate=True)
        qb0 = quantize(bc, cand.fmt_b, scaling=sb, saturate=True)
        return run, (lambda: mm(qa0, qb0))

    def timeit(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        cp.cuda.Device().synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(args.reps):
            start.record()
            fn()
            end.record()
            cp.cuda.Device().synchronize()
            end.synchronize()
            ts.append(start.elapsed_time(end))
        ts.sort()
        return ts[len(ts) // 2]

    print(f"DCNv2 MLP stack, batch {B}, one training step's GEMMs (median of {args.reps}, ms)")
    print("LoKA+cast: both operands quantized from float32 (fp8lab.gpu.quantize) and multiplied; "
          "LoKA GEMM: operands already quantized (the cast fused into their producers)")
    print(f"{'site':18} {'M x N x K':>20} {'choice':24} {'bf16':>8} {'LoKA+cast':>10} {'LoKA GEMM':>10}")
    tot_b = tot_l = tot_g = 0.0
    for site, a, b, layout, cand in sites:
        M, K = a.shape
        N = b.shape[0] if layout == "nt" else b.shape[1]
        tb = timeit(bf16_call(a, b, layout))
        if cand.is_high:
            tl = tg = tb
        else:
            with_cast, gemm_only = fp8_call(a, b, layout, cand)
            tl, tg = timeit(with_cast), timeit(gemm_only)
        tot_b += tb
        tot_l += tl
        tot_g += tg
        print(f"{site:18} {f'{M}x{N}x{K}':>20} {cand.label:24} {tb:8.3f} {tl:10.3f} {tg:10.3f}")
    print(f"{'step total':64} {tot_b:8.3f} {tot_l:10.3f} {tot_g:10.3f}")
    for name, t in (("with separate casts", tot_l), ("GEMMs only (casts fused upstream)", tot_g)):
        sp = tot_b / t
        print(f"speed-up of LoKA's choices over bf16 cuBLAS, {name}: {sp:.2f}x (target >= 1.2x: "
              f"{'met' if sp >= 1.2 else 'missed'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
