"""Floor 0: services every stage may use, standard library only (and the leaf config.py).

- cache.py: the disk cache (entries, atomic writes, the size bound, digests).
- timing.py: the timing tree behind `--time` and gir.jit's stats.
"""
