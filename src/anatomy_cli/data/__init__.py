"""Corpora: sources -> text -> character vocabulary -> train/val ids -> batches.

  corpus    the text pipeline: reading, the vocabulary, splits, encoding (no torch)
  sources   document sources: JSON Lines, Parquet, a datasets save_to_disk folder, hf:NAME
  prepared  folders written by `anatomy prepare`, loaded without re-reading the text
  load      the entry points: open_source, corpus_from_source, load_corpus
  batches   training and validation windows as tensors, moved to the model's device

Imports: store, spec.
"""
