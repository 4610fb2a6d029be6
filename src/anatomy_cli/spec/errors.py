"""The one base class of bad input (no imports, no torch).

Every domain error that means "this input cannot be used" derives from InputError: a spec or
option (ConfigError), a run directory (RunError), a corpus (DataError), a baseline (BaselineError),
an executor address (ExecutorError), sampling options (SampleError), a position past the learned
table (PositionError), a full KV cache (CacheFullError), an export target (ExportError), a results file or README
block (ResultsError). The CLI
catches this one class and prints its message as one line with exit code 2; a library raises it
with a message that names the file, key or option at fault.

A directory in use by another live process is not bad input: lockfile.Locked (exit 3).
"""

from __future__ import annotations


class InputError(ValueError):
    """Input that cannot be used; the message is one line naming what is at fault."""
