"""GPU (CuPy) codecs and GEMMs."""
