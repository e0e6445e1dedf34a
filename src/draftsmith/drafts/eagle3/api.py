"""The EAGLE-3 family contract (drafts/__init__.py): what train/, eval/ and serve/ call, by name."""

from __future__ import annotations

from .config import config_from_export, config_from_target, layer_rule  # noqa: F401
from .export import layer_ids_from_export, load_exported  # noqa: F401
from .infer import Eagle3Proposer as Proposer  # noqa: F401
from .model import PROGRESS, Eagle3Draft as Model, attach_target, describe, scalars, summarize  # noqa: F401
