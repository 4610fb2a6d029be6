"""Studies: a spec expanded into runs, executed locally or on Dask, timed, estimated (no torch here).

  plan       expand(spec) -> planned runs (designs, axes, sizes, seeds, ids), then execute them
  jobs       a planned run as a job, and the local executor (processes, stacked seeds)
  dask_exec  the same jobs on a dask.distributed cluster
  worker     one spawned process that never outlives its caller
  calibrate  plan estimates from this machine's measured step times, cached
  ladder     a size ladder's plan, size by size
  timing     the fair timing pass (its running half; report.speed judges it)

Imports: training, exams, model, data, store, spec; torch only inside the workers.
"""
