"""The `anatomy` entry point: the app from cli.app with every command module registered on it.

Exit codes (stable, for scripts): see cli.app.
"""

from __future__ import annotations

# Each module registers its commands on import, in the order --help lists them.
from anatomy_cli.cli import exams, run, sweep, parts, scale_plan, tools  # noqa: F401  # isort: skip
from anatomy_cli.cli.app import app, keep_exit_code

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    finally:
        keep_exit_code()
