"""Format declarations (data files read by fp8lab.formats)."""
