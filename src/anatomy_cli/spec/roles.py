"""The words a study's runs and effects are named by, said once (no imports beyond typing).

A run's role in its design (components.role): the reference end (every studied component off), the
all-on end, an add-one run (+f: the reference end with f) or a remove-one run (-f: the all-on end
without f). An effect's direction names the end it is measured from: added to the reference end,
removed from the all-on end. Specs, plans, the timing pass, reports and results files all use these.
"""

from __future__ import annotations

from typing import Literal

REFERENCE, ALL_ON = "reference", "all-on"
ADD_ONE, REMOVE_ONE = "add-one", "remove-one"
Direction = Literal["add-one", "remove-one"]
DIRECTIONS: tuple[Direction, ...] = (ADD_ONE, REMOVE_ONE)
END_OF = {ADD_ONE: REFERENCE, REMOVE_ONE: ALL_ON}  # the end each direction's effects start from
VERB = {ADD_ONE: "added", REMOVE_ONE: "removed"}  # how a report says the direction
SHOWN = {"llama": "LLaMA"}  # an end's name as reports print it (its slug elsewhere)
SIGN = {ADD_ONE: "+", REMOVE_ONE: "-"}  # the sign a variant run's role carries before its component


def shown(name: str) -> str:
    """An end's name as a report prints it: 'llama' -> 'LLaMA'; any other name as it is."""
    return SHOWN.get(name, name)


def variant(flip: str, direction: str) -> str:
    """The role of the run that flips `flip` in `direction`: '+flip' (add-one: the reference end with
    it) or '-flip' (remove-one: the all-on end without it)."""
    return SIGN[direction] + flip


def parse_variant(role: str) -> tuple[Direction, str] | None:
    """A variant run's role -> (direction, flip): '+f' -> ('add-one', 'f'), '-f' -> ('remove-one', 'f');
    None for an end's role or '' (no variant)."""
    return next(((d, role[1:]) for d, sign in SIGN.items() if role[:1] == sign), None)
