"""Corpora: sources -> text -> vocabulary (characters or a tokenizer) -> train/val ids -> batches.

  corpus     the text pipeline: reading, the character vocabulary, splits, encoding (no torch)
  tokenizer  tokenizers besides char: byte-level BPE (bpe:N), tokenizer.json, hf:NAME; bytes per token
  sources    document sources: JSON Lines, Parquet, a datasets save_to_disk folder, hf:NAME
  prepared   folders written by `anatomy prepare` (nanoGPT's train.bin/val.bin layout), memmapped
  load       the entry points: open_source, corpus_from_source, load_corpus, run_corpus
  batches    training and validation windows as tensors, moved to the model's device; bits per byte

Imports: store, spec.
"""
