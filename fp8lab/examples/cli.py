"""``fp8lab dlrm``: train the example DLRM in float32, naive FP8 and with LoKA, print the table.

Light at import (argparse only): the experiment's modules load when the command runs.
Data (the markdown results table) on stdout, progress on stderr; exit 0 ok, 1 runtime failure,
2 usage.
"""

from __future__ import annotations

import sys

__all__ = ["add_parser", "cmd_dlrm"]

_DESCRIPTION = ("Train a DLRM / DCNv2-style model on synthetic click data (labelled by a random "
                "teacher, so the best achievable logloss is known) in float32, in naive FP8 "
                "(every GEMM e4m3 forward, e5m2 gradients, per-tensor scaling) and with LoKA's "
                "per-site choices, on paired seeds. Prints AUC, logloss and normalized entropy "
                "(mean ± spread over seeds) and the share of GEMM FLOPs run in 8 bits.")


def add_parser(subparsers):
    """Add the ``dlrm`` subcommand to an argparse ``subparsers`` object."""
    from .train import add_arguments

    p = subparsers.add_parser("dlrm", help="train the example DLRM: float32 vs naive FP8 vs LoKA",
                              description=_DESCRIPTION)
    add_arguments(p)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.set_defaults(func=cmd_dlrm)
    return p


def cmd_dlrm(args) -> int:
    from .train import run_from_args

    try:
        return run_from_args(args, "fp8lab dlrm " + " ".join(sys.argv[2:]))
    except ValueError as exc:
        if getattr(args, "debug", False):
            raise
        print(f"fp8lab: error: {exc}", file=sys.stderr)
        return 2
