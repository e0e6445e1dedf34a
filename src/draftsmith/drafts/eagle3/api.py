"""The EAGLE-3 family contract (drafts/__init__.py): what train/, eval/ and serve/ call, by name."""

from __future__ import annotations

from ..eagle_config import layer_rule
from ..eagle_summary import PROGRESS, describe, scalars
from ..family import FamilyCode
from .config import config_from_export, config_from_target
from .export import layer_ids_from_export, load_exported
from .infer import Eagle3Proposer as Proposer
from .model import Eagle3Draft as Model, attach_target, summarize

CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS)
