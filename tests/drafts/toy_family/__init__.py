"""A toy draft family defined entirely in tests/, to prove that a family is one folder and nothing in src/.

It is its own kind of draft, not a renamed one: a one-token MLP draft that reads the target's aux states
at position t and the embedding of token t+1 and predicts token t+2 through the target's lm_head
(borrowed). It brings everything the rest of draftsmith asks of a family:

- its own supervision kind, ``toy_next`` (``supervision.py``: dataclass + builder + KINDS), which its
  description names (``supervision_module``), so registering the family declares it to the engines'
  registry (draftsmith.supervision) and every engine (hf, cache, remote) computes it;
- its own layout (``toy``) and export: config.json with architecture ``ToyMLPDraftModel`` and its layer
  ids under ``toy_layer_ids``, tensors ``fc.weight``, ``mix.weight``, ``norm.weight``;
- its own serving answer: no engine serves it, so ``serve``/``export`` refuse it through
  ``serve_refusal`` in one line, and ``draftsmith eval`` decodes it exactly (its proposer, K = 1).

Register it with one line, as a built-in family is: ``register(toy_family.FAMILY)``.

This file is its description (torch-free); ``api.py`` is its code.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.drafts.family import DraftConfig, positive

ARCH = "ToyMLPDraftModel"


@dataclass
class ToyDraftConfig(DraftConfig):
    """``draft`` section of ``type: toy``: the MLP's width."""

    type: str = "toy"
    toy_width: int = 32  # the MLP's hidden width over the concatenated aux states

    def problems(self) -> list[str]:
        return super().problems() + positive(self, "toy_width")


def _family():
    from draftsmith.drafts.family import Family

    return Family(
        name="toy", display="Toy (MLP)", api="toy_family.api", config=ToyDraftConfig, supervision="toy_next",
        supervision_module="toy_family.supervision",
        recognises=lambda config: (config.get("architectures") or [None])[0] == ARCH, layout="toy",
        first_layer_id=0, layer_ids_key="toy_layer_ids", borrows_lm_head=True,
        serve_refusal=("draft is a toy MLP draft: no engine has a model for it, so nothing serves it; measure it "
                       "with `draftsmith eval --draft {source} --prompts mt_bench` (exact offline decoding)"),
        required_keys=("hidden_size", "vocab_size", "toy_width", "toy_layer_ids"),
    )


FAMILY = _family()
