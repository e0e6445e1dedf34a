"""draftsmith: train speculative-decoding drafts for a frozen target LLM and serve them.

Vocabulary used everywhere in this package (and only these words):

- **target**: the frozen LLM whose generation we want faster.
- **draft**: the small model we train to propose tokens the target would produce.
- **engine**: how the target runs (``hf``, ``vllm``, ``sglang``, ``remote``).
- **features**: what an engine returns for a batch (aux hidden states, logits or draft-vocab
  probabilities).
- **K**: speculative tokens per step. **tau**: mean tokens committed per target forward, bonus
  token included (``1 + accepted / drafts``). **draft vocab**: the pruned output vocabulary.

Importing this package imports nothing heavy (no torch, no engines).
"""

__version__ = "0.1.0"
