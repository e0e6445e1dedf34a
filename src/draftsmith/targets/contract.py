"""The supervision contract as the engines use it (re-exported from :mod:`draftsmith.supervision`).

Whatever engine ran the target (hf, vllm, sglang, remote, cache), its
:class:`~draftsmith.targets.Features` become draft training targets through the supervision kind a
family names. The kinds themselves live with the families (``drafts/eagle_supervision.py``,
``drafts/block_supervision.py``) and reach the engines through the registry in
:mod:`draftsmith.supervision`, which sits below both packages: targets/ never imports drafts/ and
knows no family. This module gathers what the engines call, so they import it from one place.

Layer ids follow the vLLM convention (our *engine ids*, :mod:`draftsmith.supervision.layers`): id ``i``
is the residual stream after ``i`` decoder layers, ``0`` is the embedding output and ``L`` is the last
layer's output before the final norm.
"""

from __future__ import annotations

from draftsmith.supervision import (LAYER_ID_RULES, SUPERVISION, SupervisionKind, TargetError,  # noqa: F401
                                    default_layer_ids, register_layer_rule, register_supervision, supervise,
                                    supervision_from_tensors, supervision_kind, supervision_kinds,
                                    supervision_tensors, supervision_to, unregister_supervision)
from draftsmith.supervision.head import (LOGITS_CHUNK_ELEMENTS, HeadForm, TargetHead, chunk_rows,  # noqa: F401
                                         draft_vocab_targets, head_form_of, rebuild_logits)
from draftsmith.supervision.layers import (ENGINE_ORDER_WHY, ascending_layer_ids,  # noqa: F401
                                           default_aux_layer_ids, engine_default_aux_layer_ids,
                                           validate_layer_ids)
from draftsmith.supervision.tensors import shift_left  # noqa: F401
