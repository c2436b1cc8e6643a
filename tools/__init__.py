"""Products built on a run that are not part of the algorithm: report.py (the run's HTML page)
and export.py (its environments as an installable GEM / Gymnasium package)."""
