"""A study: a spec's plan trained and judged, as library calls the CLI renders (no printing, no exit).

  ablation   `anatomy ablate`: the settings asked, the plan and its refusals, workers and stacking, the
             estimate, the training (in --decide's rounds or at once), what it did
  rounds     run_rounds: --decide's loop (looks, futility, budget, stop reason) over any trainer, the
             one the CLI runs and benchmarks/calibrate_verdict.py --decide measures
  lr_study   `ablate --tune-lr`: the LR grid per config on selection seeds, each config's LR frozen in
             tune.json, then the study at those LRs (and the shared LR beside it)
  lr_selection  fair learning rates: the LR grid, the rule, run_selection (the loop over any trainer)
  reporting  `anatomy report`: the Report built once, where it may write, the side files
  sizes      a size ladder's plan per size (scale-plan, ablate --dry-run)

Imports: report, sweep, exams, training, store, spec (everything below it but the model); never cli.
"""
