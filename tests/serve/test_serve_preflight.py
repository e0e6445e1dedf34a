"""The architecture pre-flight (issue: a tested architecture matrix, blocker 6 / item 3): one line, exit 2 before any
engine starts, read from the installed vLLM's own registry (tests marked ``vllm`` import it; none starts a server).

Targets are config.json dirs written here: doctor and the pre-flight read config.json only, so no weights are needed.
"""

from __future__ import annotations

import json

import pytest

import serve_ckpts as sc
from draftsmith.cli import main

GEMMA3_ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}


def arch_target(d, arch: str, model_type: str, **extra):
    """A 6-layer hidden-8 target (serve_ckpts' sizes, so the fixture drafts fit) of architecture ``arch``."""
    return sc.make_target(d, architectures=[arch], model_type=model_type, **extra)


def gemma3(d, **extra):
    """A Gemma 3 text target in transformers 5's style: rope_parameters per layer type, no top-level rope_theta."""
    return arch_target(d, "Gemma3ForCausalLM", "gemma3_text", **{"rope_theta": None, "rope_parameters": GEMMA3_ROPE,
                                                                 **extra})


def foo(d):
    return arch_target(d, "FooForCausalLM", "foo")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def lines_naming(text: str, needle: str) -> list[str]:
    return [ln for ln in text.splitlines() if needle in ln]


@pytest.fixture
def no_engine_starts(monkeypatch):
    """A server or engine start fails the test instead of starting vLLM (what code without the pre-flight did)."""
    import draftsmith.data.regenerate as regen
    import draftsmith.serve.vllm as serve_vllm

    def started(*a, **k):
        raise AssertionError(f"an engine was started: {a}")

    monkeypatch.setattr(serve_vllm, "launch", started)
    monkeypatch.setattr(regen, "VLLMGenerator", started)


# ------------------------------------------------------------------------------------------------ doctor
@pytest.mark.vllm
def test_doctor_llama_and_gpt_oss_targets_are_native_in_one_line(tmp_path, capsys):
    draft = sc.make("eagle3", tmp_path / "d")
    for arch, model_type in (("LlamaForCausalLM", "llama"), ("GptOssForCausalLM", "gpt_oss")):
        t = arch_target(tmp_path / arch, arch, model_type)
        code, out, err = run(capsys, "doctor", draft, "--target", t)
        assert code == 0, (out, err)
        found = lines_naming(err, f"target {arch}")
        assert len(found) == 1 and "natively" in found[0] and "implements SupportsEagle3" in found[0], err


@pytest.mark.vllm
def test_doctor_gemma3_target_needs_the_transformers_backend(tmp_path, capsys):
    draft, t = sc.make("eagle3", tmp_path / "d"), gemma3(tmp_path / "g3", rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    code, out, err = run(capsys, "doctor", draft, "--target", t)
    assert code == 1, (out, err)
    problems = out.splitlines()
    assert len(problems) == 1 and problems[0].startswith("PROBLEM target Gemma3ForCausalLM"), out
    for needle in ("does not implement SupportsEagle3", "Transformers backend", "pass --transformers-backend"):
        assert needle in problems[0], problems[0]
    # served through the backend: a note, and doctor is clean
    code, out, err = run(capsys, "doctor", draft, "--target", t, "--transformers-backend")
    assert code == 0 and "PROBLEM" not in out, (out, err)
    found = lines_naming(err, "target Gemma3ForCausalLM")
    assert len(found) == 1 and "as asked (--model-impl transformers)" in found[0], err


def test_doctor_unknown_architecture_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = run(capsys, "doctor", sc.make("eagle3", tmp_path / "d"), "--target", foo(tmp_path / "foo"))
    assert code == 2 and out == "", (out, err)
    assert len(err.splitlines()) == 1, err
    for needle in ("FooForCausalLM", "model_type 'foo'", "upgrade transformers"):
        assert needle in err, err


def test_doctor_without_vllm_warns_in_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    draft = sc.make("eagle3", tmp_path / "d")
    code, out, err = run(capsys, "doctor", draft, "--target", sc.make_target(tmp_path / "t"))
    assert code == 0, (out, err)
    found = lines_naming(err, "target LlamaForCausalLM")
    assert len(found) == 1 and found[0].startswith("draftsmith doctor: warning:") and "not installed" in found[0], err
    code, out, err = run(capsys, "doctor", draft, "--target", sc.make_target(tmp_path / "t"), "--engine", "sglang")
    assert code == 0 and "vllm is not installed" not in err, err
    assert run(capsys, "doctor", draft, "--target", foo(tmp_path / "foo"))[0] == 2


def test_doctor_reads_per_layer_type_rope_parameters(tmp_path, capsys):
    # Gemma 3 (transformers 5): one rope set per layer type; the draft is held to full attention's (1e6)
    from draftsmith.serve.doctor import diagnose
    from draftsmith.serve.resolve import resolve_draft

    t = gemma3(tmp_path / "g3")
    problems, notes = diagnose(resolve_draft(sc.make("eagle3", tmp_path / "d")), target=str(t), engine="sglang")
    assert problems == ["config.json: rope_theta 10000 != target rope_theta 1e+06; positions would rotate differently "
                        "than in training: set the target's value (and retrain if trained so)"], problems
    rope = [n for n in notes if "per layer type" in n]
    assert len(rope) == 1 and "the draft uses full_attention's (rope_theta 1000000.0" in rope[0], notes
    cfg = sc.eagle_config(rope_theta=1000000.0)
    problems, _ = diagnose(resolve_draft(sc.draftsmith_checkpoint(tmp_path / "e", cfg, sc.eagle_state())),
                           target=str(t), engine="sglang")
    assert problems == [], problems
    # scaling inside the full-attention set counts too
    scaled = gemma3(tmp_path / "g3s", rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    problems, _ = diagnose(resolve_draft(sc.draftsmith_checkpoint(tmp_path / "f", cfg, sc.eagle_state())),
                           target=str(scaled), engine="sglang")
    assert problems == ["config.json: rope scaling none != target's linear; copy the target's rope_scaling into the "
                        "draft config"], problems


# ------------------------------------------------------------------------------------------------ serve vllm
@pytest.mark.vllm
def test_serve_vllm_gemma3_is_refused_in_one_line_then_accepted_with_the_flag(tmp_path, capsys):
    draft, t = sc.make("eagle3", tmp_path / "d"), gemma3(tmp_path / "g3")
    code, out, err = run(capsys, "serve", "vllm", "--target", t, "--draft", draft, "-k", 3, "--print-only")
    assert code == 2 and out == "", (out, err)
    assert len(err.splitlines()) == 1 and err.startswith("draftsmith: error: target Gemma3ForCausalLM"), err
    assert "pass --transformers-backend" in err, err
    code, out, err = run(capsys, "serve", "vllm", "--target", t, "--draft", draft, "-k", 3, "--print-only",
                         "--transformers-backend")
    assert code == 0, err
    assert out.count("--model-impl transformers") == 1, out
    # passed by hand after --: accepted as the flag is, and not doubled
    code, out, err = run(capsys, "serve", "vllm", "--target", t, "--draft", draft, "-k", 3, "--print-only",
                         "--transformers-backend", "--", "--model-impl", "transformers")
    assert code == 0 and out.count("--model-impl") == 1, (out, err)
    code, out, err = run(capsys, "serve", "vllm", "--target", t, "--draft", draft, "-k", 3, "--print-only",
                         "--transformers-backend", "--", "--model-impl", "vllm")
    assert code == 2 and "--model-impl vllm" in err, err
    # a native target: no --model-impl, and the verdict is one note
    llama = sc.make_target(tmp_path / "llama")
    code, out, err = run(capsys, "serve", "vllm", "--target", llama, "--draft", draft, "-k", 3, "--print-only")
    assert code == 0 and "--model-impl" not in out, (out, err)
    assert len(lines_naming(err, "target LlamaForCausalLM")) == 1, err


@pytest.mark.vllm
@pytest.mark.parametrize("kind", ["peagle", "dflash"])
def test_serve_vllm_refuses_every_family_on_gemma3(tmp_path, capsys, kind):
    # P-EAGLE (eagle3 + parallel drafting) and DFlash read the target's aux states through SupportsEagle3 too
    code, out, err = run(capsys, "serve", "vllm", "--target", gemma3(tmp_path / "g3"), "--draft",
                         sc.make(kind, tmp_path / "d"), "--print-only")
    assert code == 2 and "SupportsEagle3" in err and len(err.splitlines()) == 1, err


@pytest.mark.vllm
def test_serve_vllm_refusal_writes_nothing(tmp_path, capsys, no_engine_starts):
    draft = sc.make("eagle3", tmp_path / "d")  # model.-prefixed weights: serving writes a stripped copy
    before = sc.tree_digest(tmp_path / "d")
    code, out, err = run(capsys, "serve", "vllm", "--target", gemma3(tmp_path / "g3"), "--draft", draft, "-k", 3)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert sc.tree_digest(tmp_path / "d") == before


def test_serve_vllm_unknown_architecture_is_refused(tmp_path, capsys):
    code, out, err = run(capsys, "serve", "vllm", "--target", foo(tmp_path / "foo"), "--draft",
                         sc.make("eagle3", tmp_path / "d"), "-k", 3, "--print-only")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "FooForCausalLM" in err, err


# ------------------------------------------------------------------------------------------------ check / advise
@pytest.mark.vllm
def test_check_refuses_before_the_offline_decode(tmp_path, capsys):
    code, out, err = run(capsys, "check", "--target", gemma3(tmp_path / "g3"), "--draft",
                         sc.make("eagle3", tmp_path / "d"), "--prompts", "mt_bench", "--out", tmp_path / "out")
    assert code == 2 and len(err.splitlines()) == 1 and "--transformers-backend" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.vllm
def test_advise_refuses_before_any_server(tmp_path, capsys):
    draft, t = sc.make("eagle3", tmp_path / "d"), gemma3(tmp_path / "g3")
    code, out, err = run(capsys, "advise", "--target", t, "--draft", draft, "--prompts", "mt_bench",
                         "--out", tmp_path / "out")
    assert code == 2 and len(err.splitlines()) == 1 and "--transformers-backend" in err, err
    assert not (tmp_path / "out").exists()
    # accepted: every server (the target alone, ngram, the draft) gets --model-impl transformers
    from draftsmith.serve.preflight import require_servers
    from draftsmith.serve.resolve import resolve_draft

    lines, extra = require_servers(str(t), [resolve_draft(draft).config], transformers_backend=True,
                                   extra=["--enforce-eager"])
    assert extra == ["--enforce-eager", "--model-impl", "transformers"], extra
    assert len(lines) == 2 and all("Transformers backend" in ln for ln in lines), lines


# ------------------------------------------------------------------------------------------------ train / cache / regenerate
@pytest.mark.vllm
def test_vllm_feature_engine_refuses_before_vllm_starts(tmp_path):
    from draftsmith.targets import open_engine
    from draftsmith.targets.architecture import FEATURES_JOB, GENERATE_JOB, NATIVE, check_vllm
    from draftsmith.targets.contract import TargetError

    t = gemma3(tmp_path / "g3")
    # vLLM's own Gemma 3 class lacks SupportsEagle3, and its Transformers backend cannot run extract_hidden_states
    # (vLLM applies --model-impl to that model too: tests/matrix saw its SpeculativeConfig fail), so the one
    # answer is the hf engine, asked for or not
    for kwargs in (None, {"model_impl": "transformers"}):
        with pytest.raises(TargetError, match=r"target.engine: vllm: target Gemma3ForCausalLM .* use target.engine: hf"):
            check_vllm(t, reads_aux=True, engine_kwargs=kwargs, job=FEATURES_JOB)
    with pytest.raises(TargetError, match=r"use target.engine: hf"):
        open_engine("vllm", str(t))
    # plain generation (regenerate) has vLLM's own class: native
    assert check_vllm(t, reads_aux=False, job=GENERATE_JOB).kind == NATIVE


@pytest.mark.vllm
def test_cache_with_the_vllm_engine_refuses_before_writing(tmp_path):
    from draftsmith.cache.build import build_cache
    from draftsmith.config import build_config
    from draftsmith.targets.contract import TargetError
    from fixtures import write_chats

    cfg = build_config({"target": {"path": str(gemma3(tmp_path / "g3")), "engine": "vllm"},
                        "data": {"sources": [str(write_chats(tmp_path / "chats.jsonl", 4))]},
                        "output": {"dir": str(tmp_path / "run")}})
    with pytest.raises(TargetError, match="use target.engine: hf"):
        build_cache(cfg, tmp_path / "cache", progress=False, log=lambda s: None)
    assert not (tmp_path / "cache").exists()


@pytest.mark.vllm
def test_train_and_cache_with_the_vllm_engine_are_one_line_and_exit_2(tmp_path, capsys):
    import yaml

    from fixtures import write_chats

    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"target": {"path": str(gemma3(tmp_path / "g3")), "engine": "vllm"},
                                   "data": {"sources": [str(write_chats(tmp_path / "chats.jsonl", 4))]},
                                   "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}))
    for argv in (["train", cfg, "--no-progress"], ["cache", cfg, "--out", tmp_path / "cache"]):
        code, out, err = run(capsys, *argv)
        assert code == 2 and len(err.splitlines()) == 1, (argv, out, err)
        assert "Gemma3ForCausalLM" in err and "use target.engine: hf" in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_regenerate_refuses_an_unknown_architecture_before_writing(tmp_path, engine, no_engine_starts):
    from draftsmith.data.regenerate import RegenSettings, regenerate
    from draftsmith.targets.contract import TargetError
    from fixtures import write_chats

    with pytest.raises(TargetError, match="FooForCausalLM"):
        regenerate([str(write_chats(tmp_path / "chats.jsonl", 2))], tmp_path / "out", str(foo(tmp_path / "foo")),
                   RegenSettings(engine=engine), progress=False, log=lambda s: None)
    assert not (tmp_path / "out").exists()


def test_hf_engine_unknown_architecture_is_one_line(tmp_path):
    from draftsmith.targets.contract import TargetError
    from draftsmith.targets.hf import HFEngine

    with pytest.raises(TargetError) as e:
        HFEngine(foo(tmp_path / "foo"))
    assert "\n" not in str(e.value) and "model_type 'foo'" in str(e.value) and "upgrade transformers" in str(e.value)


# ------------------------------------------------------------------------------------------------ the matrix
# What vLLM 0.32 answers, read from its registry; the test asks the class itself as well, so a vLLM that
# changes its answer fails here by name.
MATRIX = [
    ("LlamaForCausalLM", "llama", {}, "native"),
    ("Qwen3ForCausalLM", "qwen3", {}, "native"),
    ("Qwen3MoeForCausalLM", "qwen3_moe", {"num_experts": 8}, "native"),
    ("MistralForCausalLM", "mistral", {}, "native"),
    ("Phi3ForCausalLM", "phi3", {}, "native"),
    ("GraniteForCausalLM", "granite", {}, "native"),
    ("Gemma3ForCausalLM", "gemma3_text", {}, "transformers-backend"),
    ("GptOssForCausalLM", "gpt_oss", {"num_local_experts": 4}, "native"),
    ("DeepseekV3ForCausalLM", "deepseek_v3", {"n_routed_experts": 8}, "native"),
    ("MixtralForCausalLM", "mixtral", {"num_local_experts": 8}, "transformers-backend"),
    ("Gemma2ForCausalLM", "gemma2", {}, "transformers-backend"),
    ("Qwen2MoeForCausalLM", "qwen2_moe", {"num_experts": 8}, "transformers-backend"),
    ("CohereForCausalLM", "cohere", {}, "transformers-backend"),
    ("FooForCausalLM", "foo", {}, "unknown-to-transformers"),
]


@pytest.mark.vllm
@pytest.mark.parametrize("arch,model_type,extra,kind", MATRIX, ids=[m[0] for m in MATRIX])
def test_the_installed_vllm_answers_the_architecture_matrix(arch, model_type, extra, kind):
    pytest.importorskip("vllm")
    from vllm.model_executor.models.interfaces import supports_eagle3
    from vllm.model_executor.models.registry import ModelRegistry

    from draftsmith.targets.architecture import vllm_verdict

    v = vllm_verdict({"architectures": [arch], "model_type": model_type, "num_hidden_layers": 6, **extra})
    assert v.kind == kind and arch in v.line and "\n" not in v.line, v
    entry = ModelRegistry.models.get(arch)
    if kind == "native":
        assert supports_eagle3(entry.load_model_cls())
    elif kind == "transformers-backend":
        assert not supports_eagle3(entry.load_model_cls()) and v.opt_in
    else:
        assert entry is None
    # plain generation (regenerate) needs only a class: every registered one serves it
    if entry is not None:
        assert vllm_verdict({"architectures": [arch], "model_type": model_type, **extra}, reads_aux=False).kind == "native"


def test_config_json_reading(tmp_path):
    from draftsmith.targets.architecture import UNCHECKED, read_config, vllm_verdict
    from draftsmith.targets.contract import TargetError

    assert vllm_verdict(tmp_path).kind == UNCHECKED  # no config.json: a note, never a failure
    assert vllm_verdict({"model_type": "llama"}).kind == UNCHECKED  # no architectures
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TargetError, match="not valid JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert read_config(tmp_path / "config.json")[0] == {"architectures": ["X"]}
