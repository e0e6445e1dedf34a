"""bench/peer_speculators.py's conversion of our feature cache into speculators' offline layout.

A tiny hand-made cache (3 rows, 2 aux layers, hidden 8) goes through ``convert``; the result is read
back the way speculators 0.9.0 reads it (``load_from_disk(data_path)`` in torch format,
``hidden_states/hs_<i>.safetensors``, ``[:, :-1]`` = aux states, ``[:, -1]`` = the verifier's last
state, the first int(N * train_data_ratio) rows train), without speculators installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("peer_speculators_bench", ROOT / "bench" / "peer_speculators.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_cache(root: Path) -> tuple[Path, list]:
    from draftsmith.cache.store import FORMAT, VERSION, encode_shard, write_manifest
    from draftsmith.data.dataset import Example

    g = torch.Generator().manual_seed(0)
    rows, examples = [], []
    for t, ids in enumerate(([5, 6, 7, 8], [9, 5, 5, 10, 11], [12, 13, 6])):
        mask = [0] + [1] * (len(ids) - 1)
        rows.append({"input_ids": torch.tensor(ids, dtype=torch.int32), "loss_mask": torch.tensor(mask, dtype=torch.uint8),
                     "aux": torch.randn(len(ids), 2, 8, generator=g).to(torch.bfloat16),
                     "last": torch.randn(len(ids), 8, generator=g).to(torch.bfloat16)})
        examples.append(Example(input_ids=ids, loss_mask=mask))
    data, _, tokens = encode_shard(rows)
    cache = root / "cache"
    cache.mkdir()
    (cache / "shard-000000.safetensors").write_bytes(data)
    write_manifest(cache, {"format": FORMAT, "version": VERSION, "aux_layer_ids": [0, 1], "dtype": "bfloat16",
                           "data": {"fingerprint": "tiny"},
                           "shards": [{"file": "shard-000000.safetensors", "rows": 3, "tokens": tokens}]})
    return cache, list(zip(examples, rows))


def test_split_ratio_reproduces_speculators_split(peer):
    for n_train, n in [(291, 315), (1, 2), (2, 3), (999, 1000), (1, 1000)]:
        assert int(n * peer.split_ratio(n_train, n)) == n_train
    with pytest.raises(ValueError):
        peer.split_ratio(3, 3)


def test_token_freq_counts_loss_mask_tokens_only(peer):
    assert peer.token_freq([([1, 2, 2, 3], [0, 1, 1, 0]), ([2, 4], [1, 1])]) == {2: 3, 4: 1}


def test_peer_sample_stacks_aux_then_last(peer):
    row = {"input_ids": torch.tensor([3, 4], dtype=torch.int32), "aux": torch.zeros(2, 3, 5), "last": torch.ones(2, 5)}
    s = peer.peer_sample(row)
    assert s["hidden_states"].shape == (2, 4, 5) and s["token_ids"].dtype == torch.int64
    assert torch.equal(s["hidden_states"][:, -1], row["last"]) and torch.equal(s["hidden_states"][:, :-1], row["aux"])
    with pytest.raises(ValueError):
        peer.peer_sample({**row, "last": torch.ones(3, 5)})


def test_convert_writes_speculators_layout(peer, tmp_path):
    load_from_disk = pytest.importorskip("datasets").load_from_disk  # the demo extra (make test installs it)
    from safetensors.torch import load_file

    cache, pairs = tiny_cache(tmp_path)
    examples = [ex for ex, _ in pairs]
    out = tmp_path / "peer_data"
    manifest = peer.convert(cache, examples[:2], examples[2:], out)
    assert manifest["train_rows"] == 2 and manifest["held_out_rows"] == 1 and manifest["tokens"] == 12
    ds = load_from_disk(str(out))  # speculators' ArrowDataset: load_from_disk(data_path), torch format
    assert len(ds) == 3 and int(len(ds) * manifest["train_data_ratio"]) == 2
    for i, (ex, row) in enumerate(pairs):
        item = ds[i]
        assert item["input_ids"].tolist() == ex.input_ids and item["loss_mask"].tolist() == ex.loss_mask
        assert int(item["seq_len"]) == len(ex.input_ids)
        hs = load_file(str(out / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(hs["token_ids"], item["input_ids"])  # ArrowDataset's torch.equal check
        assert torch.equal(hs["hidden_states"][:, :-1].flatten(1), row["aux"].flatten(1))
        assert torch.equal(hs["hidden_states"][:, -1], row["last"])
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    assert freq == {6: 1, 7: 1, 8: 1, 5: 2, 10: 1, 11: 1}  # the train rows' loss-mask tokens (first tokens masked)
    # the same rows again: reused as written; other rows: rewritten
    stamp = (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns
    assert peer.convert(cache, examples[:2], examples[2:], out) == json.loads((out / peer.DATA_MARK).read_text())
    assert (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns == stamp
    again = peer.convert(cache, examples[:1], examples[1:], out)
    assert again["train_rows"] == 1 and int(3 * again["train_data_ratio"]) == 1


def test_convert_refuses_rows_missing_from_the_cache(peer, tmp_path):
    pytest.importorskip("datasets")
    from draftsmith.data.dataset import Example

    cache, pairs = tiny_cache(tmp_path)
    with pytest.raises(SystemExit, match="not in"):
        peer.convert(cache, [pairs[0][0], Example(input_ids=[1, 2, 3], loss_mask=[0, 1, 1])], [pairs[1][0]],
                     tmp_path / "peer_data")


def test_finish_report_compares_each_set_and_k_and_marks_lossless_rows(peer, tmp_path, capsys):
    """The verdict and JSON both peer benches print (finish_report): ours vs the peer's tau per (set, K),
    and whether each configuration's tokens equal no speculation's on that set."""
    from argparse import Namespace

    def row(label, k, tau, outputs, s="mt_bench"):
        return {"label": label, "k": k, "prompt_set": s, "tau": tau, "outputs": outputs, "name": f"{label} K={k}",
                "tokens_per_s": 1.0, "per_position": [], "drafts": 1}

    results = [row("none", 0, 1.0, [[1, 2]]), row("draftsmith", 3, 1.2, [[1, 2]]), row("modelopt", 3, 1.25, [[1, 3]])]
    side = {"steps": 2, "tokens": 10, "train_s": 5.0, "checkpoint": "c"}
    args = Namespace(prompt_sets=["mt_bench"], k=[3])
    rep = peer.finish_report(results, args, {"serve": 1.0}, tmp_path / "r.json", report={"target": "t"},
                             sides=(("ours", "draftsmith", side), ("theirs", "modelopt", side)), peer_name="ModelOpt's")
    assert rep["verdict"] == {"mt_bench@K3": {"draftsmith_tau": 1.2, "modelopt_tau": 1.25, "ours_ge_theirs": False}}
    assert [r["same_tokens_as_none"] for r in rep["results"]] == [True, True, False]
    assert json.loads((tmp_path / "r.json").read_text())["training"] == {"draftsmith": side, "modelopt": side}
    assert "our real tau >= ModelOpt's: mt_bench@K3 1.200 vs 1.250 (no)" in capsys.readouterr().out


def test_run_launcher_runs_the_peer_script_and_names_its_log_when_it_fails(peer, tmp_path):
    """run_launcher (both peer benches' trainer step): the launcher gets SUMMARY WALL_S *rest, its summary
    comes back with the settings and argv; a failing launcher is one SystemExit naming its log."""
    import sys

    ok = "import json, sys\njson.dump({'steps': 3, 'args': sys.argv[1:]}, open(sys.argv[1], 'w'))\n"
    out = peer.run_launcher("toy", Path(sys.executable), ok, tmp_path / "run", tmp_path / "s.json", 5.0, ["fit", "--", "x"],
                            {"a": 1})
    assert out["steps"] == 3 and out["args"] == [str(tmp_path / "s.json"), "5.0", "fit", "--", "x"]
    assert out["settings"] == {"a": 1} and json.loads((tmp_path / "s.json").read_text())["argv"][2:] == out["args"]
    with pytest.raises(SystemExit, match=r"peer bench: toy's trainer exited with 3; log .*train.log:\n.*boom"):
        peer.run_launcher("toy", Path(sys.executable), "import sys\nprint('boom')\nsys.exit(3)\n", tmp_path / "run2",
                          tmp_path / "s2.json", 5.0, [], {})
