"""anatomy: take a language model apart and measure what each part is worth."""

__version__ = "0.1.0"
