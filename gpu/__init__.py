"""CUDA sources compiled at run time by fp8lab.gpu."""
