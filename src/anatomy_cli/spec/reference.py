"""The published reference size (README) and what each component adds to it, in parameters (no torch).

`anatomy components` reports every component's change against this size, from either end.
"""

from __future__ import annotations

from anatomy_cli.spec import components
from anatomy_cli.spec.config import ConfigError, ModelConfig, validate

REFERENCE_SIZE = {"vocab_size": 1719, "d_model": 128, "n_layer": 4, "n_head": 4, "n_kv_head": 4, "ctx_len": 128}


def param_change(c, end_on: bool) -> tuple[int, int] | None:
    """(total, active per token) parameters the component adds (negative: removes) at the published
    size, from the 2017 end (end_on False) or the LLaMA end; None for a component that does not touch
    the model, or (a spec's own) cannot be placed at that size (n_head = 3 does not divide d_model 128)."""
    if not any(k.startswith("model.") for k in c.keys):
        return None
    model = REFERENCE_SIZE | components.model_settings(components.FIVE, on=end_on, model=REFERENCE_SIZE)
    flat = components.flatten({"model": model})
    counts = []
    for state in (True, False):
        settings = {k.removeprefix("model."): v for k, v in c.settings(state, flat).items() if k.startswith("model.")}
        try:
            cfg = validate(ModelConfig, model | settings)
        except ConfigError:
            return None
        counts.append((cfg.num_params(), cfg.active_params()))
    return counts[0][0] - counts[1][0], counts[0][1] - counts[1][1]
