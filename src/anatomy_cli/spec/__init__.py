"""What a run and a study are, as validated data (no torch): the boundary every input crosses once.

  errors       InputError, the one base class of bad input
  config       pydantic specs: ModelConfig, TrainConfig, DataConfig, RunConfig, AblationSpec; --set
  knobs        a study's knobs spelled once: --set KEY=VALUE over the study spec, and the older flags as
               aliases from one table (what the report's advice commands are written from too)
  components   the component table (every part anatomy can switch, one row each) and the roles a
               run's settings give it in a design
  roles        the words runs and effects are named by: reference / all-on, add-one / remove-one
  parts        the parts registry: what each slot of the block can hold, by name (anatomy's own FFNs,
               norms and positions, and each plugin's), the `part` decorator, loading plugin files and
               installed packages' entry points
  reference    the published reference size, and the parameters each component adds to it

Imports: nothing of anatomy_cli outside spec/.
"""
