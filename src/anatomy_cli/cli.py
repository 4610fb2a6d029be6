"""The `anatomy` entry point: the app from cli_app with every command module registered on it.

Exit codes (stable, for scripts): see cli_app.
"""

from __future__ import annotations

from . import cli_exams, cli_run, cli_scale, cli_sweep, cli_tools  # noqa: F401  (each registers its commands)
from .cli_app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
