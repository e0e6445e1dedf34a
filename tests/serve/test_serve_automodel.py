"""NeMo AutoModel's EAGLE-family checkpoints as they are: config.json with the TARGET's num_hidden_layers
over weights holding fewer layers, and no aux layer ids. serve/export/doctor make the copy declare the
layers the weights hold (one printed fixup), never touch the source, and still refuse what no fixup
explains (layers missing in the middle, more layers than declared)."""

import json
import shlex

import pytest

import serve_ckpts as sc
from draftsmith.serve.cli import main
from draftsmith.serve.resolve import layer_count_fixup, resolve_draft, servable_config
from test_serve_cli import launched, run  # noqa: F401 (fixture)

FIXUP = "fixup: num_hidden_layers 32 -> 1 in the served copy"


def peagle_automodel(root, layers=2, target_layers=32, **extra):
    """A P-EAGLE draft (layer 0 reads 2H, deeper layers H) under a config with the target's layer count."""
    cfg = sc.automodel_config(target_layers, parallel_drafting=True, mask_token_id=30, num_depths=4, **extra)
    state = sc.eagle_state(peagle=True)
    for i in range(1, layers):
        state.update(sc.layer_tensors(f"model.layers.{i}.", sc.H))
    return sc.write(root, cfg, state)


@pytest.mark.parametrize("case,want", [("automodel", (32, 1)), ("peagle", (32, 2)), ("eagle3", None)])
def test_fixup_is_declared_vs_held(tmp_path, case, want):
    path = {"automodel": lambda: sc.make("automodel", tmp_path), "peagle": lambda: peagle_automodel(tmp_path / "p"),
            "eagle3": lambda: sc.make("eagle3", tmp_path)}[case]()
    draft = resolve_draft(path)
    assert layer_count_fixup(draft) == want
    config, notes = servable_config(draft)
    assert config["num_hidden_layers"] == (want[1] if want else 1) and len(notes) == (1 if want else 0)
    assert draft.config["num_hidden_layers"] == (want[0] if want else 1)  # the resolved source dict is untouched


def test_peagle_num_draft_layers_follows(tmp_path):
    config, notes = servable_config(resolve_draft(peagle_automodel(tmp_path, num_draft_layers=32)))
    assert (config["num_hidden_layers"], config["num_draft_layers"]) == (2, 2)
    assert "num_hidden_layers 32 -> 2" in notes[0]


def test_serve_print_only_prints_the_fixup_and_writes_nothing(tmp_path, capsys):
    draft = sc.make("automodel", tmp_path)
    before = sc.tree_digest(tmp_path)
    code, out, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft), "--num-speculative-tokens", "3", "--print-only")
    assert code == 0, err
    assert FIXUP in err and "is left as it is" in err
    assert sc.tree_digest(tmp_path) == before
    argv = shlex.split(out.strip())
    assert json.loads(argv[argv.index("--speculative-config") + 1])["model"].endswith("vllm_export")


def test_serve_launch_serves_a_copy_with_the_layers_held(tmp_path, capsys, launched):  # noqa: F811
    draft = sc.make("automodel", tmp_path)
    source = (draft / "config.json").read_bytes()
    code, _, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft), "--num-speculative-tokens", "3")
    assert code == 0 and len(launched) == 1, err
    copy = json.loads((draft / "vllm_export" / "config.json").read_text())
    assert copy["num_hidden_layers"] == 1 and copy["architectures"] == ["LlamaForCausalLMEagle3"]
    assert "eagle_aux_hidden_state_layer_ids" not in copy["eagle_config"]  # vLLM reads its default, as AutoModel's
    assert (draft / "config.json").read_bytes() == source


def test_a_prefix_free_draft_with_a_layer_fixup_is_copied_not_edited_in_place(tmp_path, capsys, launched):  # noqa: F811
    cfg = sc.automodel_config(arch="LlamaForCausalLMEagle3")
    draft = sc.write(tmp_path / "std", cfg, sc.eagle_state(prefix=""))
    source = (draft / "config.json").read_bytes()
    code, _, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft), "--num-speculative-tokens", "3")
    assert code == 0, err
    assert (draft / "config.json").read_bytes() == source
    assert json.loads((draft / "vllm_export" / "config.json").read_text())["num_hidden_layers"] == 1


@pytest.mark.parametrize("to", ["vllm", "speculators", "sglang"])
def test_exports_carry_the_layers_held(tmp_path, capsys, to):
    draft = sc.make("automodel", tmp_path / "src")
    before = sc.tree_digest(tmp_path / "src")
    extra = ["--target", "/t", "--num-speculative-tokens", "3"] if to == "speculators" else []
    code, out, err = run(capsys, "export", "--to", to, str(draft), str(tmp_path / "out"), *extra)
    assert code == 0, err
    assert FIXUP in err
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    layer = cfg["transformer_layer_config"] if to == "speculators" else cfg
    assert layer["num_hidden_layers"] == 1
    if to == "sglang":  # no ids: SGLang's own default (2, L//2, L-3) is vLLM's and AutoModel's
        assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
        assert "eagle_aux_hidden_state_layer_ids" not in cfg["eagle_config"]
    assert sc.tree_digest(tmp_path / "src") == before


def test_sglang_serve_print_only_takes_the_automodel_checkpoint(tmp_path, capsys):
    code, _, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(sc.make("automodel", tmp_path)),
                       "--print-only")
    assert code == 0, err
    assert FIXUP in err


def test_doctor_reports_a_fixup_not_a_problem(tmp_path, capsys):
    t32 = sc.make_target(tmp_path / "t32", num_hidden_layers=32)
    code, out, err = run(capsys, "doctor", str(sc.make("automodel", tmp_path)), "--target", str(t32))
    assert code == 0 and "PROBLEM" not in out, out
    assert FIXUP in err and "will use [2, 16, 29]" in err and "equals NeMo AutoModel's default" in err


@pytest.mark.parametrize("layers,declared,needle", [
    ([0, 2], 32, "hold layers [0, 2]"),  # a layer missing in the middle: not a layer count to fix
    ([0, 1], 1, "num_hidden_layers 1 but its weights hold layers [0, 1]"),  # more layers than declared
])
def test_what_no_fixup_explains_is_still_refused(tmp_path, capsys, layers, declared, needle):
    state = sc.eagle_state()
    for i in layers[1:]:
        state.update(sc.layer_tensors(f"model.layers.{i}.", sc.H))
    draft = sc.write(tmp_path / "d", sc.automodel_config(declared), state)
    before = sc.tree_digest(tmp_path)
    code, _, err = run(capsys, "export", "--to", "vllm", str(draft), str(tmp_path / "out"))
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run(capsys, "serve", "vllm", "--target", "/t", "--draft", str(draft), "--num-speculative-tokens", "3", "--print-only")
    assert code == 2 and needle in err, err
    assert sc.tree_digest(tmp_path) == before


def cli(*argv):
    """`python -m draftsmith ...` in a subprocess: what a user's shell sees (exit code, stdout, stderr)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "draftsmith", *argv], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"})
    return p.returncode, p.stdout, p.stderr


def test_cli_serves_exports_and_doctors_the_automodel_checkpoint(tmp_path):
    draft = sc.make("automodel", tmp_path / "src")
    t32 = sc.make_target(tmp_path / "t32", num_hidden_layers=32)
    code, out, err = cli("serve", "vllm", "--target", str(t32), "--draft", str(draft), "--num-speculative-tokens", "3",
                         "--print-only")
    assert code == 0 and FIXUP in err and "Traceback" not in err, err
    code, out, err = cli("export", "--to", "vllm", str(draft), str(tmp_path / "out"))
    assert code == 0 and FIXUP in err, err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"] == 1
    code, out, err = cli("doctor", str(draft), "--target", str(t32))
    assert code == 0 and "PROBLEM" not in out and FIXUP in err, (out, err)
    # what no fixup explains: one line naming the file, exit 2, no traceback
    state = sc.eagle_state()
    state.update(sc.layer_tensors("model.layers.2.", sc.H))
    bad = sc.write(tmp_path / "bad", sc.automodel_config(), state)
    code, _, err = cli("export", "--to", "vllm", str(bad), str(tmp_path / "out2"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(bad) in err and "Traceback" not in err, err
