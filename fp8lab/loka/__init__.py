"""The LoKA engine: Probe, Mods and Dispatch.

Decides, GEMM site by GEMM site and with stated confidence, where 8-bit arithmetic is safe and
where it is fast, and picks for each site the fastest kernel that meets the error budget.
See ``docs/loka.md``.
"""

from .decision import Posterior
from .noise import Prediction, predict
from .probe import Measurement, Probe, measure
from .sites import FOLLOW_OPS, GRANULARITIES, Candidate, Site, default_candidates
from .stats import OperandStats, SiteStats

__all__ = ["Site", "Candidate", "default_candidates", "FOLLOW_OPS", "GRANULARITIES",
           "OperandStats", "SiteStats", "Prediction", "predict", "Posterior", "Probe",
           "Measurement", "measure"]
