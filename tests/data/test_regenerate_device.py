"""Where `draftsmith regenerate --engine hf` runs the target: ``--device`` (auto = the local rank's
GPU, else cpu), checked as ``train.device`` is, before the data loads; a device the machine lacks is
one line with exit 2. CUDA is faked where a test needs a GPU's answer; the engine records and stops."""

from __future__ import annotations

import pytest
import torch

import draftsmith.data.regenerate as regen
from draftsmith.cli import main
from draftsmith.data.regenerate import RegenError
from fixtures import make_tiny_llama, write_jsonl

CONVS = [{"messages": [{"role": "user", "content": "What is the capital of France?"},
                       {"role": "assistant", "content": "Paris."}]},
         {"messages": [{"role": "user", "content": "Write a haiku about the sea."}]}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("regen_device")
    return make_tiny_llama(root / "target", num_layers=2), write_jsonl(root / "chats.jsonl", CONVS)


def argv(tiny, out, *extra):
    target, data = tiny
    return ["regenerate", "--target", str(target), "--data", str(data), "--out", str(out), "--engine", "hf",
            "--dtype", "float32", "--max-new-tokens", "3", "--no-progress", *extra]


@pytest.fixture
def generators(monkeypatch):
    """(device asked, device of the loaded weights) of every hf generator opened; with ``stop`` set
    the generator stops before loading (a faked GPU could not hold it)."""
    seen: list[tuple[str, str]] = []

    class Spy(regen.HFGenerator):
        stop = False

        def __init__(self, target, s, dtype="float32", device="cpu"):
            if Spy.stop:
                seen.append((device, None))
                raise RegenError("stopped by the test after the device was recorded")
            super().__init__(target, s, dtype=dtype, device=device)
            seen.append((device, str(next(self.model.parameters()).device)))

    monkeypatch.setattr(regen, "HFGenerator", Spy)
    return Spy, seen


def test_device_cpu_runs_the_target_there(tiny, tmp_path, generators, capsys):
    _, seen = generators
    assert main(argv(tiny, tmp_path / "o", "--device", "cpu")) == 0
    assert seen == [("cpu", "cpu")]
    assert "regenerated 2 conversations" in capsys.readouterr().out


@pytest.mark.parametrize("flag,where", [("cuda:1", "cuda:1"), ("cuda", "cuda:0"), ("auto", "cuda:0")])
def test_device_reaches_the_generator(tiny, tmp_path, generators, monkeypatch, real_auto, capsys, flag, where):
    spy, seen = generators
    spy.stop = True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(argv(tiny, tmp_path / "o", "--device", flag)) == 2
    assert "stopped by the test" in capsys.readouterr().err and seen == [(where, None)]


@pytest.mark.parametrize("flag,expect", [("cuda", "--device 'cuda': this machine has no CUDA GPU"),
                                         ("cuda:0", "use --device cpu (or auto)"),
                                         ("gpu", "--device 'gpu': expected auto, cpu, cuda or cuda:N")])
def test_a_device_the_machine_lacks_is_one_line_with_exit_2(tiny, tmp_path, generators, monkeypatch, capsys, flag,
                                                            expect):
    _, seen = generators
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv(tiny, tmp_path / "o", "--device", flag)) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and "\n" not in err, err
    assert seen == [] and not (tmp_path / "o").exists()  # refused before the data or the target loads


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_hf_on_cuda_answers_with_greedy_on_cuda(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftsmith.data.regenerated import shard_rows

    target, _ = tiny
    out = tmp_path / "o"
    assert main(argv(tiny, out, "--device", "cuda")) == 0
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).to("cuda").eval()
    rows = [r for f in sorted(out.glob("shard-*.jsonl")) for r in shard_rows(f)]
    assert len(rows) == 2
    for row in rows:  # each answer is greedy on the same device, from the context before it
        msgs = row["messages"]
        i = next(j for j, m in enumerate(msgs) if m["role"] == "assistant")
        text = tok.apply_chat_template(msgs[:i], add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]], device="cuda")
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert msgs[i]["content"] == tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)
