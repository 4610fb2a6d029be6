"""The `anatomy` entry point: the app from cli.app with every command module registered on it.

Exit codes (stable, for scripts): see cli.app.
"""

from __future__ import annotations

import sys

# Each module registers its commands on import, in the order --help lists them.
from anatomy_cli.cli import exams, run, sweep, parts, scale_plan, tools  # noqa: F401  # isort: skip
from anatomy_cli.cli.app import app, keep_exit_code

__all__ = ["app", "main"]


# multiprocessing's resource tracker (a process of its own, which outlives a SIGKILLed parent) unlinks the
# semaphores of the workers' queues that the killed parent never released, and warns of each "leaked semaphore
# object" on the terminal: noise for a user, whose runs are interrupted and resumable. The tracker and spawned
# workers read their warning filters from these options (multiprocessing.util._args_from_interpreter_flags).
TRACKER_QUIET = "ignore:resource_tracker:UserWarning"


def main() -> None:
    if TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(TRACKER_QUIET)
    try:
        app()
    finally:
        keep_exit_code()
