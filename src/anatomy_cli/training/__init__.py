"""One run, trained: its lifecycle, the step loop, stacked seeds, checkpoints, devices.

  run          RunConfig + run directory -> config.json, metrics.jsonl, weights, summary.json; resume
  trainer      the step loop of one run (Trainer) and its books (RunLog)
  stacked      the runs of one config that differ only by seed, trained as one batched model
  checkpoint   weights and resume state on disk (safetensors), loading a run back
  budgets      a budget ladder's plan: one warmup-stable-decay run, decays branched off it (no torch)
  branch       a decay branched from another run's kept stable-phase checkpoint
  devices      every device decision: where tensors live, at what precision, what memory is free
  tensorboard  TensorBoard event files for runs (optional extra)

Imports: model, data, store, spec.
"""
