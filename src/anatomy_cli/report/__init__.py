"""Run folders -> frames -> effects -> the verdict -> report files and results blocks (no torch).

  rules      a study's records read once (margin, alpha, looks, tuning, timing): what judges it
  frames     run directories -> a runs frame and a long curves frame
  effects    paired gains per component, judged one family per question (stats) by the study's rules
  stats      the one rule every call follows, and the paired statistics it rests on
  plateau    runs left on the unigram plateau: the rule, and the effects they enter
  decide     ablate --decide: rounds of seeds where effects are open, alpha split over the looks
  lr_allowance  a tuned study's runs told apart, and the LR selection's error (regret bounds, allowance)
  lr_comparison  a tuned study's calls beside the shared LR's (LR-confounded), its section
  verdict    the answer a report leads with: each component's worth, ranked
  speed      speed effects from a timing pass's record
  scale      effects across model sizes: trends
  across_tokenizers  each call at every tokenizer of a study, and whether it holds across them
  worth      a ladder's law, each part's compute (or data) multiplier, its interval, call and trend
  ladder     a study's ladder in the report: its rungs, its multipliers, or the one line why none
  sections   the report's words and tables in reading order
  textable   plain-text tables that fit a terminal (the verdict, the component table)
  figures    the report's figures (matplotlib's object API, no pyplot)
  page       a report as data, rendered to markdown and to one self-contained HTML file
  build      the Report, computed once from a folder: what every output reads
  write      write_report: every report file
  results_file    a study's results file: its typed model and its reader
  results_build   a Report as its results file
  results_blocks  the README/docs numbers rendered from results files (marked blocks)
  results_bpb     a results file written in nats per character, converted exactly to bits per byte
  rejudge    a results file judged again by today's rule, from what it records (no runs needed)
  gate       the CI regression gate: best val bits per byte per config against a committed baseline

Imports: sweep (the verdict's cost of more seeds), data (unigram loss, bits per byte), store, spec; never torch.
"""
