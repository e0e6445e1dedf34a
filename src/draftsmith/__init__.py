"""draftsmith: train speculative-decoding drafts for a frozen target LLM and serve them.

Vocabulary used everywhere in this package (and only these words):

- **target**: the frozen LLM whose generation we want faster.
- **draft**: the small model we train to propose tokens the target would produce.
- **engine**: how the target runs (``hf``, ``vllm``, ``sglang``, ``remote``).
- **features**: what an engine returns for a batch (aux hidden states, logits or draft-vocab
  probabilities).
- **K**: speculative tokens per step. **tau**: mean tokens committed per target forward, bonus
  token included (``1 + accepted / drafts``). **draft vocab**: the pruned output vocabulary.

Importing this package imports nothing heavy (no torch, no engines). It registers the built-in draft
families (their torch-free descriptions, ``draftsmith.drafts``), which declares the supervision kinds
they bring to :mod:`draftsmith.supervision`: so every process (a trainer, ``serve-target``, a cache
build) whose engines build supervision knows every kind, while targets/ never imports drafts/.
"""

__version__ = "0.1.0"

import draftsmith.drafts  # noqa: E402,F401  (the families register themselves: see above)
