"""The on-disk schema of runs and sweeps (no torch): paths, atomic writes, status, locks.

  runs      a run directory's files, written atomically and read back validated
  summary   summary.json's typed record
  records   a study's records (sweep.json, decide.json, tune.json, timing.json), typed once, one reader each
  lockfile  directory locks that name their owner

Imports: spec.
"""
