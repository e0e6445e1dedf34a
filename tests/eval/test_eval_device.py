"""Where `draftsmith eval` runs the target and the draft: ``--device`` (auto = the local rank's GPU,
else cpu), checked before anything loads; a device the machine lacks is one line with exit 2. CUDA is
faked where a test needs a GPU's answer; the engine records its device and stops."""

import json

import pytest
import torch

import draftsmith.targets.hf as hf
from draftsmith.cli import main
from draftsmith.eval import EvalError
from test_eval_cli import save_checkpoint_layout


@pytest.fixture
def run(tiny, tmp_path):
    """A checkpoint of the session's trained draft, and a one-prompt set."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "q0", "category": "facts", "turns": ["What is the capital of France?"]}) + "\n")
    return save_checkpoint_layout(tiny.draft, tmp_path / "run", tiny.path), prompts


def argv(run, out, *extra):
    ckpt, prompts = run
    return ["eval", "--draft", str(ckpt), "--prompts", str(prompts), "-k", "3", "--max-new-tokens", "8",
            "--out", str(out), "--quiet", "--no-plot", *extra]


@pytest.fixture
def engines(monkeypatch):
    """(device asked, device of the loaded target) of every hf engine eval opens; with ``stop`` set the
    engine stops before loading (a faked GPU could not hold it)."""
    seen: list[tuple[str, object]] = []

    class Spy(hf.HFEngine):
        stop = False

        def __init__(self, target, **kw):
            if Spy.stop:
                seen.append((kw.get("device"), None))
                raise EvalError("stopped by the test after the device was recorded")
            super().__init__(target, **kw)
            seen.append((kw.get("device"), self.device))

    monkeypatch.setattr(hf, "HFEngine", Spy)  # run_eval imports it from the module when it runs
    return Spy, seen


def test_device_cpu_runs_target_and_draft_there(run, tmp_path, engines, monkeypatch, capsys):
    import draftsmith.eval.offline as offline

    _, seen = engines
    drafts = []
    real = offline.check_k

    def spy_k(proposer, k, family):  # called once the draft is placed: record where its weights are
        drafts.append({p.device for p in proposer.draft.parameters()})
        return real(proposer, k, family)

    monkeypatch.setattr(offline, "check_k", spy_k)
    assert main(argv(run, tmp_path / "out", "--device", "cpu")) == 0
    assert seen == [("cpu", torch.device("cpu"))]
    assert drafts == [{torch.device("cpu")}]
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["config"]["device"] == "cpu" and rep["lossless"]["mismatches"] == []


@pytest.mark.parametrize("flag,where", [("cuda:1", "cuda:1"), ("cuda", "cuda:0"), ("auto", "cuda:0")])
def test_device_reaches_the_engine(run, tmp_path, engines, monkeypatch, real_auto, capsys, flag, where):
    spy, seen = engines
    spy.stop = True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert main(argv(run, tmp_path / "out", "--device", flag)) == 2
    assert "stopped by the test" in capsys.readouterr().err and seen == [(where, None)]


@pytest.mark.parametrize("flag,expect", [("cuda", "--device 'cuda': this machine has no CUDA GPU"),
                                         ("cuda:1", "use --device cpu (or auto)"),
                                         ("mps", "--device 'mps': expected auto, cpu, cuda or cuda:N")])
def test_a_device_the_machine_lacks_is_one_line_with_exit_2(run, tmp_path, engines, monkeypatch, capsys, flag,
                                                            expect):
    _, seen = engines
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(argv(run, tmp_path / "out", "--device", flag)) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and "\n" not in err, err
    assert seen == [] and not (tmp_path / "out").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_eval_on_cuda_is_lossless_and_samples(run, tmp_path, capsys):
    assert main(argv(run, tmp_path / "greedy", "--device", "cuda")) == 0
    rep = json.loads((tmp_path / "greedy" / "report.json").read_text())
    assert rep["config"]["device"] == "cuda:0" and rep["lossless"] == {"checked": 1, "mismatches": []}
    # sampling draws from generators on the GPU (a CPU generator cannot sample CUDA probabilities)
    assert main(argv(run, tmp_path / "sampled", "--device", "cuda", "--temperature", "0.8")) == 0
    assert json.loads((tmp_path / "sampled" / "report.json").read_text())["overall"]["tau"] >= 1.0
