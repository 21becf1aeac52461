"""End-to-end examples: a DLRM / DCNv2-style model trained in float32, naive FP8 and with LoKA.

- :mod:`fp8lab.examples.dlrm`: the model (numpy, forward and backward, every GEMM a named site).
- :mod:`fp8lab.examples.data`: synthetic click data labelled by a random teacher DLRM.
- :mod:`fp8lab.examples.train`: the experiment (paired seeds; AUC, logloss, normalized entropy,
  share of GEMM FLOPs in 8 bits, sites kept in high precision and why).
- :mod:`fp8lab.examples.report`: markdown report and PNG figures (matplotlib, optional).

Run it with ``fp8lab dlrm`` or ``python -m fp8lab.examples.train``; see ``docs/dlrm.md``.
"""
