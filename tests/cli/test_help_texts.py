"""Every command's --help shows the square brackets its source help has (issue 38: Rich markup ate
`[decide]` from `ablate --help`, which printed "A spec with a  table"). Each command's help and its
parameters' helps are read from the click command typer builds; every `[word]` in them (a `\\[` escape
read as the bracket it prints) must appear in the rendered --help."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

BRACKETED = re.compile(r"\[[^\[\]]+\]")
BOX = re.compile(r"[│╭╮╰╯─]")


def commands(cmd, path=()):
    yield list(path), cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from commands(sub, (*path, name))


def test_every_bracket_of_every_help_text_is_printed():
    holes = []
    for path, cmd in commands(typer.main.get_command(app)):
        sources = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        wanted = {" ".join(m.group(0).split()) for text in sources
                  for m in BRACKETED.finditer(text.replace("\\[", "["))}
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, (path, result.output)
        shown = " ".join(BOX.sub(" ", result.output).split())
        holes += [(" ".join(path) or "anatomy", w) for w in sorted(wanted) if w not in shown]
    assert not holes, holes
