"""Evaluation: the real number behind training proxies.

- :mod:`.speculative`: the verification loop (greedy longest-prefix + bonus; rejection sampling)
  behind a ``Proposer`` protocol (chain = EAGLE-3; parallel / block drafts plug in the same way).
- :mod:`.offline`: engine-free evaluation with the hf target and a trained draft (KV caches on both).
- :mod:`.online`: ``bench-server`` against running vLLM / SGLang servers (spec-decode counters).
- :mod:`.report`: terminal table, JSON, PNG plot of per-position acceptance, per-category breakdown.

Nothing here is imported by ``import draftsmith``; heavy modules load lazily.
"""


class EvalError(ValueError):
    """Input to ``eval``, ``bench-server``, ``check`` or ``advise`` that cannot work: a prompt file, URL,
    flag value or draft/target pair; the message names it. Fix: correct what it names (the flag's help
    says what it takes)."""
