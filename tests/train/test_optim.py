"""train.optimizer: muon (torch.optim.Muon on the 2-D hidden weights, AdamW on the rest) against the two
torch optimizers run by hand; its checkpoint state; a tiny run with every recipe knob, resumed bitwise."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from draftsmith.config import ConfigError, build_config
from draftsmith.train.checkpoint import CheckpointError
from draftsmith.train.loop import Cosine, train
from draftsmith.train.optim import MuonAdamW, build_optimizer, is_muon_param
from test_loop import run_config, tiny  # noqa: F401 (module fixture)

KNOBS = {"norm_before_residual": True, "norm_before_fc": True, "fc_norm": True, "norm_output": True,
         "freeze_lm_head": True}


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(10, 8)
        self.fc = nn.Linear(12, 8, bias=False)
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 10, bias=False)

    def forward(self, ids, x):
        return self.lm_head(self.norm(self.fc(x) + self.embed_tokens(ids))).logsumexp(-1).sum()


def train_cfg(**kw):
    return build_config({"train": {"optimizer": "muon", "lr": 0.01, "weight_decay": 0.1, **kw}}).train


def test_only_2d_hidden_weights_go_to_muon():
    m = Toy()
    got = {n for n, p in m.named_parameters() if is_muon_param(n, p)}
    assert got == {"fc.weight"}
    assert is_muon_param("module.draft.model.layers.0.self_attn.q_proj.weight", torch.zeros(2, 2))  # DDP names
    assert not is_muon_param("module.draft.lm_head.weight", torch.zeros(2, 2))


def test_muon_adamw_steps_like_the_two_torch_optimizers_by_hand():
    torch.manual_seed(0)
    a, b = Toy(), None
    b = copy.deepcopy(a)
    opt = build_optimizer(a.named_parameters(), train_cfg(muon_lr=0.02))
    assert isinstance(opt, MuonAdamW)
    ref_muon = torch.optim.Muon([b.fc.weight], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    rest = [p for n, p in b.named_parameters() if n != "fc.weight"]
    ref_adamw = torch.optim.AdamW(rest, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Cosine(1, 4, 0.0))  # both groups follow the cosine
    g = torch.Generator().manual_seed(1)
    for step in range(3):
        ids, x = torch.randint(0, 10, (4,), generator=g), torch.randn(4, 12, generator=g)
        a(ids, x).backward()
        b(ids, x).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        for o in (ref_muon, ref_adamw):
            o.step()
            o.zero_grad()
            for group in o.param_groups:  # the same lr factor by hand
                group["lr"] = (0.02 if o is ref_muon else 0.01) * Cosine(1, 4, 0.0)(step + 1)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.01 * Cosine(1, 4, 0.0)(3), 0.02 * Cosine(1, 4, 0.0)(3)])


def test_state_dict_round_trip_continues_bitwise_and_refuses_another_optimizer():
    torch.manual_seed(0)
    a = Toy()
    opt = build_optimizer(a.named_parameters(), train_cfg())
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 10, (4,), generator=g), torch.randn(4, 12, generator=g)) for _ in range(4)]
    for ids, x in batches[:2]:
        a(ids, x).backward()
        opt.step()
        opt.zero_grad()
    b = copy.deepcopy(a)
    opt_b = build_optimizer(b.named_parameters(), train_cfg())
    opt_b.load_state_dict(copy.deepcopy(opt.state_dict()))
    for group, inner in zip(opt_b.param_groups, [g for o in opt_b.parts.values() for g in o.param_groups]):
        assert group is inner  # what the LR scheduler writes after a resume reaches the torch optimizers
    for m, o in ((a, opt), (b, opt_b)):
        for ids, x in batches[2:]:
            m(ids, x).backward()
            o.step()
            o.zero_grad()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    adamw = torch.optim.AdamW(Toy().parameters())
    with pytest.raises(ValueError, match="a plain AdamW state"):
        opt_b.load_state_dict(adamw.state_dict())


def test_config_checks():
    with pytest.raises(ConfigError, match="freeze_lm_head' is true but draft.init_from_target is false"):
        build_config({"draft": {"freeze_lm_head": True, "init_from_target": False}})
    with pytest.raises(ConfigError, match=r"'train.optimizer' = 'sgd': expected one of \['adamw', 'muon'\]"):
        build_config({"train": {"optimizer": "sgd"}})


@pytest.mark.slow
def test_every_recipe_knob_trains_saves_and_resumes_bitwise(tiny, tmp_path):  # noqa: F811
    target, data = tiny
    full = train(run_config(target, data, tmp_path / "full", KNOBS, optimizer="muon", save_every=4, epochs=2),
                 progress=False)
    ckpt = full.checkpoint
    cfg = json.loads((ckpt / "model" / "consolidated" / "config.json").read_text())
    assert cfg["norm_before_residual"] is True and cfg["eagle_config"]["norm_before_fc"] is True
    w = load_file(str(ckpt / "model" / "consolidated" / "model.safetensors"))
    first = load_file(str(tmp_path / "full" / "checkpoints" / "epoch_0_step_4" / "model" / "consolidated" /
                          "model.safetensors"))
    assert torch.equal(w["lm_head.weight"], first["lm_head.weight"])  # frozen at the target's rows
    assert not torch.equal(w["model.input_norm.weight"], first["model.input_norm.weight"])  # trained
    mid = tmp_path / "full" / "checkpoints" / "epoch_0_step_4"
    resumed = train(run_config(target, data, tmp_path / "resumed", KNOBS, optimizer="muon", epochs=2), resume=mid,
                    progress=False)
    b = load_file(str(resumed.checkpoint / "model" / "consolidated" / "model.safetensors"))
    for k in w:
        assert torch.equal(w[k], b[k]), k
    with pytest.raises(CheckpointError, match="trained with train.optimizer: muon, this run asks for adamw"):
        train(run_config(target, data, tmp_path / "other", KNOBS, epochs=2), resume=mid, progress=False)
