"""The `anatomy` command: thin commands that parse, call one library function and render.

  main       the entry point: the app with every command module registered on it
  app        the Typer app, consoles, exit codes, shared options, the one-line error handler
  run        prepare, train, sample
  sweep      ablate, report
  parts      components (the component table)
  scale_plan  scale-plan
  exams      eval, stability, bench-decode, kv-budget
  tools      check (the CI gate) and export
  render     what several commands print: plans, progress displays, tables

Imports: anything below it (study, report, sweep, exams, training, model, data, store, spec).
"""
