"""NeMo AutoModel speculative-decoding recipes, as they are: map one onto a draftsmith run config.

An AutoModel recipe is a YAML file with a ``recipe_args`` block (beside ``recipe``, ``optimizer``,
``checkpoint``, ``distributed``, ``dist_env``, ``rng``, ``wandb``). :func:`map_recipe` turns every
key draftsmith has an equivalent for into the draftsmith key, lists every key it has none for (all of
them, in one :class:`~draftsmith.config.ConfigError`), and keeps one :class:`Line` per key for the
printed mapping. Keys AutoModel defaults differently from draftsmith (max_grad_norm 1.0, warmup_ratio
0.05, min_lr_ratio 0.1, shuffle_seed 42, the full draft vocab, no validation set, ...) are written
with AutoModel's value, so the run is the recipe's and not draftsmith's defaults.

Layer ids: AutoModel's ``aux_layer_ids`` (EAGLE-3 / P-EAGLE) and ``target_layer_ids`` (DFlash family)
are HF-hook ids, j = the output of decoder layer j (HF ``hidden_states[j + 1]``); draftsmith's
``target.aux_layer_ids`` are engine (vLLM) ids, the residual stream after j + 1 layers. The mapping
adds one and says so.

``config.load_config`` calls :func:`map_recipe` when a file has ``recipe_args``, so every command that
takes a run config takes a recipe; ``draftsmith train`` prints the mapping and ``draftsmith
convert-recipe IN OUT`` writes the equivalent draftsmith YAML. Facts (key names, nesting, defaults)
are from NVIDIA-NeMo/Automodel's examples/speculative/*.yaml and recipes/llm/train_{eagle3,dflash,
jetspec,domino}.py.
"""

from .convert import convert_recipe, register
from .keys import RECIPE_FAMILIES
from .mapping import Line, RecipeMapping, is_recipe, map_recipe, read_recipe

__all__ = ["Line", "RecipeMapping", "RECIPE_FAMILIES", "is_recipe", "map_recipe", "read_recipe", "convert_recipe",
           "register"]
