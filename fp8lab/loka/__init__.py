"""The LoKA engine: Probe, Mods and Dispatch."""
