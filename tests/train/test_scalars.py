"""output.wandb: the trainer's scalars reach W&B exactly as they reach TensorBoard (an offline W&B run in tmp,
read back from its .wandb file), the config keys are checked, and without the package the run stops at setup
with the install hint."""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest

from draftsmith.config import ConfigError, build_config
from draftsmith.train import scalars
from fixtures import make_tiny_llama, make_tokenizer, write_chats

HAS_WANDB = importlib.util.find_spec("wandb") is not None


def run_config(target, data, out, **output):
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 2, 3]},
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 4, "draft_vocab_size": 96},
        "draft": {"ttt_steps": 2},
        "train": {"epochs": 1, "batch_size": 4, "log_every": 1, "num_threads": 1},
        "output": {"dir": str(out), **output},
    })


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("scalars")
    return make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=4, hidden=64), write_chats(root / "c.jsonl", 12)


def wandb_history(run_file: Path) -> tuple[dict, dict]:
    """(the run record's project/name/config, {(tag, step): value}) from an offline run's ``run-*.wandb`` file.

    Its format is LevelDB's log: a 7-byte file header (``:W&B``, magic, version), then 32 KiB blocks of
    records, each a 7-byte header (crc32, uint16 length, type 1 full / 2 first / 3 middle / 4 last) and a
    chunk of one serialised ``wandb_internal_pb2.Record``; a block tail under 7 bytes is padding."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, buf, run, history = 7, 32768, b"", {}, {}
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            break
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind not in (1, 4):
            continue
        record = pb.Record()
        record.ParseFromString(buf)
        if record.WhichOneof("record_type") == "run":
            run = {"project": record.run.project, "name": record.run.display_name,
                   "config": {u.key: json.loads(u.value_json) for u in record.run.config.update}}
        elif record.WhichOneof("record_type") == "history":
            step = record.history.step.num
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                if not key.startswith("_"):  # _step, _runtime, _timestamp: W&B's own
                    history[(key, step)] = json.loads(item.value_json)
    return run, history


def tensorboard_scalars(log_dir: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {(tag, e.step): e.value for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)}


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (the optional extra: pip install 'draftsmith[wandb]')")
def test_wandb_offline_run_logs_what_tensorboard_logs(tiny, tmp_path, monkeypatch):
    from draftsmith.train.loop import train

    monkeypatch.setenv("WANDB_MODE", "offline")  # never the network
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    target, data = tiny
    res = train(run_config(target, data, tmp_path / "run", wandb=True, wandb_project="proj"), progress=False)
    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    run, history = wandb_history(run_file)
    tb = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert {"train/loss", "train/lr", "eval/loss"} <= {tag for tag, _ in tb} and res.step == 2
    assert history.keys() == tb.keys()
    assert all(history[k] == pytest.approx(tb[k], rel=1e-6) for k in tb)  # TensorBoard stores float32
    assert run["project"] == "proj" and run["name"] == "run"  # the name defaults to output.dir's
    assert run["config"]["train"]["batch_size"] == 4 and run["config"]["output"]["wandb"] is True


def test_config_keys():
    assert build_config({}).output.wandb is False and build_config({}).output.tensorboard is True
    cfg = build_config({"output": {"wandb": True, "wandb_mode": "offline", "wandb_name": "n"}})
    assert (cfg.output.wandb_mode, cfg.output.wandb_name, cfg.output.wandb_project) == ("offline", "n", None)
    with pytest.raises(ConfigError) as err:
        build_config({"output": {"wandb": True, "wandb_mode": "sometimes"}})
    assert "'output.wandb_mode' = 'sometimes': expected one of ['online', 'offline', 'disabled']" in str(err.value)
    with pytest.raises(ConfigError, match=r"'output.wandb_project' is set but output.wandb is false; set output.wandb: "
                                          r"true to log to W&B, or remove output.wandb_project"):
        build_config({"output": {"wandb_project": "p"}})


def test_without_the_package_the_run_stops_at_setup_with_the_install_hint(tiny, tmp_path, monkeypatch):
    from draftsmith.train.loop import Trainer

    real = importlib.util.find_spec
    monkeypatch.setattr(scalars.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    target, data = tiny
    with pytest.raises(ConfigError) as err:
        Trainer(run_config(target, data, tmp_path / "run", wandb=True), progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "pip install 'draftsmith[wandb]'" in msg and "output.wandb: false" in msg
    assert not (tmp_path / "run").exists()  # nothing written: it stopped before the target loaded


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (the optional extra: pip install 'draftsmith[wandb]')")
def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    output = build_config({"output": {"dir": str(tmp_path / "run"), "tensorboard": False, "wandb": True}}).output
    first = scalars.WandbSink(output, tmp_path / "run", {})
    first.close()
    assert (tmp_path / "run" / scalars.RUN_ID_FILE).read_text().strip() == first.run.id
    again = scalars.WandbSink(output, tmp_path / "run", {}, resumed=True)
    again.close()
    assert again.run.id == first.run.id
