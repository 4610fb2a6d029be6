"""Exams for trained or sized models: lengths, stability, decode cost, KV budgets, export.

  lengths    a run's best weights at other context lengths
  stability  depth stability per label, from a runs frame
  decode     prefill/decode speed and decode-state bytes of a model's sizes
  kv_budget  KV-cache bytes from sizes alone (no torch)
  export     a LLaMA-shaped run as a Hugging Face LlamaForCausalLM folder
  parts_check  the battery a part passes (anatomy's own rows and a plugin's): shapes, causality,
             cached decode, determinism, parameter counts, gradients, bf16, stacking

Imports: training, model, data, store, spec.
"""
