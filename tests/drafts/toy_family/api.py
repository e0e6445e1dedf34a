"""The toy family's contract (drafts/__init__.py): its model, proposer, export and metrics, all its own."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from draftsmith.drafts.family import FamilyCode
from draftsmith.drafts.layers import LossParts, RMSNorm
from draftsmith.drafts.proposer import Proposal, choose

from . import ARCH

PROGRESS = {"acc": "accuracy"}


@dataclass
class ToyConfig:
    hidden_size: int
    vocab_size: int
    num_aux: int
    toy_width: int
    rms_norm_eps: float = 1e-6

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size  # it reads the target's embeddings: the target's width


class ToyDraft(nn.Module):
    """h = norm(mix([silu(fc(cat aux_t)) | embed(token_{t+1})])), logits = target lm_head(h) for token t+2."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.num_aux * cfg.hidden_size, cfg.toy_width, bias=False)
        self.mix = nn.Linear(cfg.toy_width + cfg.hidden_size, cfg.hidden_size, bias=False)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.__dict__["embed_tokens"] = None  # the target's, borrowed: never in state_dict
        self.__dict__["lm_head"] = None

    def attach(self, embeddings: torch.Tensor, lm_head: torch.Tensor) -> None:
        self.__dict__["embed_tokens"] = embeddings.detach()
        self.__dict__["lm_head"] = lm_head.detach()

    def logits(self, aux: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """aux (..., n, H), next_ids (...) -> (..., V)."""
        x = F.silu(self.fc(aux.flatten(-2).to(self.fc.weight.dtype)))
        e = F.embedding(next_ids, self.embed_tokens).to(x.dtype)
        return F.linear(self.norm(self.mix(torch.cat([x, e], -1))), self.lm_head.to(x.dtype)).float()

    def supervised(self, sup: Any, generators: Any = None) -> SimpleNamespace:
        m = sup.label_mask.bool()
        logits = self.logits(sup.aux_hidden[m], sup.next_ids[m])  # (M, V)
        ce = F.cross_entropy(logits, sup.labels[m], reduction="sum")
        parts = LossParts.of([ce], [m.sum()], [1.0])
        hits = (logits.argmax(-1) == sup.labels[m]).sum()
        return SimpleNamespace(loss=parts.loss(), parts=parts,
                               sums={"correct": hits.detach().reshape(1), "count": m.sum().reshape(1)})

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        return {"architectures": [ARCH], **asdict(self.cfg), "toy_layer_ids": list(aux_layer_ids),
                "torch_dtype": torch_dtype, "draftsmith": {"draft_type": "toy"}}


class ToyProposer:
    """One token a round: the aux states of the newest position with a state (n - 1) and the newest token
    (n) give token n + 1."""

    kind = "chain"
    max_k = default_k = trained_k = 1
    k_knob = "toy drafts draft one token"

    def __init__(self, draft: ToyDraft):
        self.draft = draft

    def reset(self) -> None:
        pass

    @torch.no_grad()
    def propose(self, state) -> Proposal:
        if state.k != 1:
            raise ValueError(f"k={state.k}: a toy draft drafts 1 token; use k = 1")
        n = state.aux.shape[0]
        logits = self.draft.logits(state.aux[n - 1][None], torch.tensor([state.tokens[n]]))
        tokens, q = choose(logits, torch.arange(self.draft.cfg.vocab_size), self.draft.cfg.vocab_size, state)
        return Proposal(tokens, q)

    def commit(self, state, num_accepted: int) -> None:
        pass


def layer_rule(draft: Any):
    return "eagle3", None  # the engines' 3-id default (2, L//2, L-3)


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> ToyConfig:
    return ToyConfig(hidden_size=info.hidden_size, vocab_size=info.vocab_size, num_aux=num_layer_ids,
                     toy_width=draft.toy_width, rms_norm_eps=info.rms_norm_eps)


def config_from_export(config: dict) -> ToyConfig:
    return ToyConfig(hidden_size=config["hidden_size"], vocab_size=config["vocab_size"],
                     num_aux=len(config["toy_layer_ids"]), toy_width=config["toy_width"],
                     rms_norm_eps=config.get("rms_norm_eps", 1e-6))


def attach_target(model: ToyDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any, layer: Any = None) -> None:
    model.attach(embeddings, head()[0])


def load_exported(config: dict, state: dict, target_embeddings: Optional[torch.Tensor] = None,
                  target_lm_head: Optional[torch.Tensor] = None) -> ToyDraft:
    model = ToyDraft(config_from_export(config))
    model.load_state_dict({k: v.float() for k, v in state.items()})  # strict: a wrong file fails by name
    if target_embeddings is not None:
        model.attach(target_embeddings.float(), (target_lm_head if target_lm_head is not None
                                                 else target_embeddings).float())
    return model.eval()


def layer_ids_from_export(config: dict) -> list[int]:
    return list(config["toy_layer_ids"])


def summarize(sums: dict) -> dict:
    n = float(sums["count"].sum())
    acc = float(sums["correct"].sum()) / max(n, 1.0)
    return {"accuracy": acc, "step_accuracy": [acc], "simulated_tau": 1.0 + acc, "positions": int(n)}


def scalars(summary: dict) -> dict:
    return {"accuracy": summary["accuracy"], "simulated_tau": summary["simulated_tau"]}


def describe(summary: dict) -> str:
    return f"next-next-token accuracy {summary['accuracy']:.3f}"


CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=ToyDraft, Proposer=ToyProposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS)
