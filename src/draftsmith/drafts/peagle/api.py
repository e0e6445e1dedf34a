"""The P-EAGLE family contract (drafts/__init__.py): what train/, eval/ and serve/ call, by name."""

from __future__ import annotations

from ..eagle_config import layer_rule
from ..family import FamilyCode
from .config import config_from_export, config_from_target  # noqa: F401
from .export import layer_ids_from_export, load_exported  # noqa: F401
from .infer import PEagleProposer as Proposer  # noqa: F401
from .model import PROGRESS, PEagleDraft as Model, attach_target, describe, summarize  # noqa: F401
from .model import eagle3 as _eagle3

scalars = _eagle3.scalars

CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS)
