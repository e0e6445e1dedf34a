"""Hub ids, offline-first: a hub-layout cache built here (no network) resolves a target id and a dataset id
with a split slice; a missing id is one line naming it and the `hf download` command (exit 2 via the CLI)."""

from __future__ import annotations

import json

import pytest

from draftsmith import hub
from draftsmith.data.formats import DataError
from draftsmith.data.sources import iter_rows, load_conversations
from draftsmith.models import resolve_target
from draftsmith.targets.contract import TargetError
from fixtures import HUB_COMMIT as COMMIT
from fixtures import hub_snapshot as repo_snapshot
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl


def chat(i: int, subject: str) -> dict:
    return {"messages": [{"role": "user", "content": f"Tell me about the {subject} {i}."},
                         {"role": "assistant", "content": f"The {subject} {i} is quick."}]}


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory):
    """An HF_HOME whose hub cache holds model org/tiny, dataset org/chat (splits train_sft/test_sft, jsonl,
    messages) and dataset org/pairs (one parquet train split, prompt/response columns)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    home = tmp_path_factory.mktemp("hf_home")
    make_tiny_llama(repo_snapshot(home / "hub", "model", "org/tiny"), make_tokenizer("chatml"), num_layers=4, hidden=64)
    data = repo_snapshot(home / "hub", "dataset", "org/chat") / "data"
    data.mkdir()
    write_jsonl(data / "train_sft-00000-of-00001.jsonl", [chat(i, "cat") for i in range(12)])
    write_jsonl(data / "test_sft-00000-of-00001.jsonl", [chat(i, "sea") for i in range(4)])
    # a repo of two configs (subsets), as openai/gsm8k's main/socratic: README `configs:`, a dir per config
    multi = repo_snapshot(home / "hub", "dataset", "org/multi")
    (multi / "README.md").write_text("---\nconfigs:\n- config_name: easy\n  data_files:\n  - split: train\n"
                                     "    path: easy/train-*\n  - split: test\n    path: easy/test-*\n"
                                     "- config_name: hard\n  data_files:\n  - split: test\n    path: hard/test-*\n---\n")
    for config, split, n in (("easy", "train", 6), ("easy", "test", 2), ("hard", "test", 3)):
        (multi / config).mkdir(exist_ok=True)
        write_jsonl(multi / config / f"{split}-00000-of-00001.jsonl", [chat(i, f"{config} {split}") for i in range(n)])
    (repo_snapshot(home / "hub", "dataset", "org/pairs") / "data").mkdir()
    rows = [{"prompt": f"Name a colour {i}.", "response": f"Blue {i}."} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), home / "hub" / "datasets--org--pairs" / "snapshots" / COMMIT / "data" /
                   "train-00000-of-00001.parquet")
    return home


@pytest.fixture
def offline_cache(hf_home, monkeypatch):
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hf_home


def test_what_reads_as_a_hub_id(tmp_path, monkeypatch):
    assert hub.is_hub_id("meta-llama/Llama-3.1-8B-Instruct")
    assert hub.is_hub_id("HuggingFaceH4/ultrachat_200k:train_sft[:200000]", dataset=True)
    assert not hub.is_hub_id("HuggingFaceH4/ultrachat_200k:train_sft[:200000]")  # a target takes no split
    for local in ("data/train.jsonl", "./org/name", "/abs/org/name", "a/b/c", "smollm2", "builtin:sharegpt"):
        assert not hub.is_hub_id(local, dataset=True), local
    monkeypatch.chdir(tmp_path)
    assert hub.is_hub_id("org/name")
    (tmp_path / "org" / "name").mkdir(parents=True)  # an existing local org/name directory wins
    assert not hub.is_hub_id("org/name")
    assert hub.parse_dataset_id("org/x:train[10%:]") == ("org/x", "train[10%:]")
    assert hub.parse_dataset_id("org/x") == ("org/x", None)


def test_target_id_resolves_to_its_cached_snapshot(offline_cache):
    path = resolve_target("org/tiny")
    assert path == str(offline_cache / "hub" / "models--org--tiny" / "snapshots" / COMMIT)
    assert json.loads((offline_cache / "hub" / "models--org--tiny" / "snapshots" / COMMIT / "config.json").read_text())[
        "num_hidden_layers"] == 4


def test_dataset_id_with_a_split_slice(offline_cache):
    convs, report = load_conversations(["org/chat:train_sft[:3]"])
    assert [c[0]["content"] for c in convs] == [f"Tell me about the cat {i}." for i in range(3)]
    assert report.total == 3 and report.kept == 3
    convs, _ = load_conversations(["org/chat:test_sft[-2:]"])
    assert [c[1]["content"] for c in convs] == ["The sea 2 is quick.", "The sea 3 is quick."]
    # no split: `train` when there is one (prompt/response columns mapped to messages)
    convs, _ = load_conversations(["org/pairs"])
    assert convs[4] == [{"role": "user", "content": "Name a colour 4."}, {"role": "assistant", "content": "Blue 4."}]
    with pytest.raises(DataError, match=r"splits \['test_sft', 'train_sft'\] and none is train; name one, "
                                        r"e\.g\. 'org/chat:test_sft'"):
        iter_rows("org/chat")
    with pytest.raises(DataError) as err:
        load_conversations(["org/chat:validation"])
    assert "\n" not in str(err.value) and "name a split the repo has as 'org/chat:<split>[<slice>]'" in str(err.value)


def test_dataset_repo_of_several_configs(offline_cache):
    """`org/name:config[:split[slice]]` picks a config; a lone word that names a config is one; none named
    (and no default) is one line listing them; a config whose only split is not train needs no split."""
    first = lambda specs: [c[0]["content"] for c in load_conversations(specs)[0]]  # noqa: E731
    assert hub.is_hub_id("org/multi:easy:test[:1]", dataset=True)
    assert first(["org/multi:easy"]) == [f"Tell me about the easy train {i}." for i in range(6)]
    assert first(["org/multi:easy:test[-1:]"]) == ["Tell me about the easy test 1."]
    assert first(["org/multi:hard"]) == [f"Tell me about the hard test {i}." for i in range(3)]  # its only split
    assert first(["org/multi:easy:train[2:4]"]) == ["Tell me about the easy train 2.", "Tell me about the easy train 3."]
    for spec, expect in (("org/multi", "has configs ['easy', 'hard'] and no default; name one as "
                                       "'org/multi:<config>[:<split>[<slice>]]', e.g. 'org/multi:easy'"),
                         ("org/multi:medium:train", "no config 'medium' (its configs are ['easy', 'hard'])"),
                         ("org/chat:cfg:train_sft", "no config 'cfg' (it has no named configs)")):
        with pytest.raises(DataError) as err:
            iter_rows(spec)
        assert "\n" not in str(err.value) and expect in str(err.value), str(err.value)
    # a slice's own colon is no config separator
    assert len(first(["org/chat:train_sft[10:]"])) == 2


def test_missing_ids_are_one_line_with_the_fetch_command(offline_cache):
    with pytest.raises(TargetError) as err:
        resolve_target("org/missing")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("target.path: hub model 'org/missing' is not in the local Hugging Face "
                                              f"cache ({offline_cache / 'hub'})")
    assert "`hf download org/missing`" in msg and "HF_HUB_OFFLINE" in msg
    with pytest.raises(DataError) as err:
        iter_rows("org/nodata:train[:10]")
    msg = str(err.value)
    assert "\n" not in msg and "hub dataset 'org/nodata' is not in the local" in msg
    assert "`hf download org/nodata --repo-type dataset`" in msg


def test_online_miss_downloads_into_the_cache_only_what_a_target_needs(offline_cache, monkeypatch):
    """With the network allowed a miss is a download (huggingface_hub's, faked here: no network in tests)."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    calls = []

    def fake(repo_id, *, repo_type, cache_dir, local_files_only=False, allow_patterns=None):
        calls.append((repo_id, repo_type, cache_dir, local_files_only, allow_patterns))
        if local_files_only:
            raise LocalEntryNotFoundError("not cached")
        return str(offline_cache / "hub" / "models--org--tiny" / "snapshots" / COMMIT)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    assert resolve_target("org/new").endswith(COMMIT)
    cache = offline_cache / "hub"
    assert calls == [("org/new", "model", cache, True, None), ("org/new", "model", cache, False, hub.MODEL_PATTERNS)]

    def refused(repo_id, *, local_files_only=False, **kw):
        raise LocalEntryNotFoundError("not cached") if local_files_only else OSError("Connection refused\nmore")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refused)
    with pytest.raises(TargetError, match=r"^target\.path: hub model 'org/new' is not cached .* could not be "
                                          r"downloaded \(Connection refused\); check the id, then fetch it with "
                                          r"`hf download org/new`$"):
        resolve_target("org/new")


def test_train_on_hub_ids_and_missing_ids_exit_2(offline_cache, tmp_path, capsys):
    """Target, data.sources (with a slice) and data.eval_sources as hub ids train end to end; a missing
    target id or dataset id through the CLI is one stderr line and exit code 2."""
    import yaml

    from draftsmith.cli import main

    cfg = {"target": {"path": "org/tiny", "aux_layer_ids": [1, 2, 3]},
           "data": {"sources": ["org/chat:train_sft[:8]"], "eval_sources": ["org/chat:test_sft"], "max_length": 64,
                    "draft_vocab_size": 96},
           "draft": {"ttt_steps": 2},
           "train": {"epochs": 1, "batch_size": 4, "log_every": 1, "num_threads": 1},
           "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "trained 2 steps" in out and "held-out from data.eval_sources ['org/chat:test_sft']" in out
    for override, needle in (("target.path=org/missing", "`hf download org/missing`"),
                             ("data.sources=[org/nodata]", "`hf download org/nodata --repo-type dataset`")):
        assert main(["train", str(path), "--no-progress", "--set", override]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
