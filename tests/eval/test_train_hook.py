"""The trainer's `train.spec_eval_every` hook logs real tau (engine-free decoding) next to simulated tau."""

from types import SimpleNamespace

import pytest

from draftsmith.config import ConfigError, build_config
from draftsmith.data.dataset import Example
from draftsmith.eval.offline import held_out_tau, trainer_spec_eval
from draftsmith.train.loop import train
from eval_helpers import AUX_IDS
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl


class Writer:
    def __init__(self):
        self.scalars = {}

    def add_scalar(self, name, value, step):
        self.scalars[name] = (value, step)


def test_hook_decodes_held_out_prompts_cut_before_the_answer(tiny, capsys):
    examples = [Example(ids + [5, 6, 7], [0] * len(ids) + [1, 1, 1]) for ids in tiny.prompts[:3]]
    examples.append(Example([1, 2, 3], [1, 1, 1]))  # no prompt before the answer: skipped
    cfg = SimpleNamespace(train=SimpleNamespace(spec_eval_prompts=2), draft=SimpleNamespace(ttt_steps=3))
    trainer = SimpleNamespace(engine=SimpleNamespace(model=tiny.model), eval_set=examples, cfg=cfg, draft=tiny.draft,
                              aux_ids=AUX_IDS, tokenizer=tiny.tok, writer=Writer(), step=7)
    out = trainer_spec_eval(trainer, simulated=1.9)
    ref = held_out_tau(tiny.model, tiny.draft, AUX_IDS, tiny.prompts[:2], k=3, max_new_tokens=32,
                       eos_ids=[tiny.tok.eos_token_id])
    assert out["real_tau"] == ref["tau"] > 1.0
    assert trainer.writer.scalars == {"spec/real_tau": (ref["tau"], 7), "spec/simulated_tau": (1.9, 7)}
    line = f"step 7: real tau {ref['tau']:.3f} (K=3, 2 held-out prompts, simulated tau 1.900)"
    assert line in capsys.readouterr().err
    assert not tiny.draft.training


def test_hook_skips_without_an_hf_model(capsys):
    cfg = SimpleNamespace(train=SimpleNamespace(spec_eval_prompts=2))
    trainer = SimpleNamespace(engine=object(), eval_set=[Example([1, 2], [0, 1])], cfg=cfg, step=3)
    assert trainer_spec_eval(trainer) == {} and "spec eval skipped at step 3" in capsys.readouterr().err


def test_config_keys_are_validated():
    assert build_config({"train": {"spec_eval_every": 5}}).train.spec_eval_prompts == 8
    with pytest.raises(ConfigError, match="spec_eval_every"):
        build_config({"train": {"spec_eval_every": -1}})


def test_trainer_runs_the_hook_every_n_steps_and_at_the_end(tmp_path, capsys):
    target = make_tiny_llama(tmp_path / "target", make_tokenizer("chatml"), num_layers=4, hidden=64)
    rows = [{"messages": [{"role": "user", "content": f"Tell me about {i}."},
                          {"role": "assistant", "content": f"The number {i} is quick and lazy."}]} for i in range(8)]
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": AUX_IDS},
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 2, "draft_vocab_size": 96},
        "draft": {"ttt_steps": 2},
        "train": {"max_steps": 2, "batch_size": 2, "spec_eval_every": 1, "spec_eval_prompts": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    err = capsys.readouterr().err
    assert err.count("real tau") == 2  # after step 1 (step 2 is the last: the final eval covers it)
    assert "simulated tau" in err and res.eval["real_tau"] >= 1.0 and len(res.eval["real_acceptance_per_position"]) == 2
