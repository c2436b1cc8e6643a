"""The third-party benchmarks eval.py drives, reimplemented or glued to their packages:
ACEBench (acebench.py), BFCL v4 and tau2-bench (toolbench.py)."""


class MissingDataset(FileNotFoundError):
    """A benchmark's data is not where the run looks for it (the message says how to get it)."""
