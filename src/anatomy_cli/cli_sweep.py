"""Sweep-level commands: ablate and report (registered on the main Typer app)."""
