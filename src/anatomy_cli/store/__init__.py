"""The on-disk schema of runs and sweeps (no torch): paths, atomic writes, status, locks.

  runs      a run directory's files, written atomically and read back validated
  summary   summary.json's typed record
  lockfile  directory locks that name their owner

Imports: spec.
"""
