"""The DSpark family contract (drafts/__init__.py): what train/, eval/ and serve/ call, by name."""

from __future__ import annotations

from ..block_infer import BlockProposer as Proposer
from ..family import FamilyCode
from .config import config_from_export, config_from_target, layer_rule
from .export import checkpoint_meta, layer_ids_from_export, load_exported
from .model import DSparkDraft as Model, attach_target
from .summary import PROGRESS, describe, scalars, summarize

CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS, checkpoint_meta=checkpoint_meta)
