"""bench/data_ab.py's arm specs and row selection: which conversations each arm trains on.

Hand-made regenerate dirs (two shards, a complete manifest) stand in for `draftsmith regenerate` output;
nothing trains or evaluates.
"""

from __future__ import annotations

import json
import random
import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.data.regenerated import FORMAT, finish, shard_name

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def ab():
    return SimpleNamespace(**runpy.run_path(str(BENCH / "data_ab.py")))  # not as __main__: nothing runs


def conv(prompt: str, answer: str = "ok") -> dict:
    return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}


def regen_dir(path: Path, rows: list[dict], complete: bool = True) -> Path:
    path.mkdir(parents=True)
    half = len(rows) // 2
    for i, part in enumerate([rows[:half], rows[half:]]):
        (path / shard_name(i)).write_text("".join(json.dumps(r) + "\n" for r in part))
    if complete:
        finish(path, {"format": FORMAT, "settings": {}}, 2, {})
    else:
        (path / "manifest.json").write_text(json.dumps({"format": FORMAT, "settings": {}}))
    return path


def test_parse_arm_reads_names_parts_and_counts(ab):
    assert ab.parse_arm("demo=demo") == ("demo", [("demo", None, None)])
    assert ab.parse_arm("copy=demo,runs/data/copy:40") == ("copy", [("demo", None, None), ("runs/data/copy", 40, None)])
    assert ab.parse_arm("first=runs/multi@1") == ("first", [("runs/multi", None, 1)])
    assert ab.parse_arm("first=runs/multi@2:30") == ("first", [("runs/multi", 30, 2)])
    # a colon or @ that is not followed by a count belongs to the path
    assert ab.parse_arm("w=C:/data/x@y") == ("w", [("C:/data/x@y", None, None)])
    assert ab.part_label("runs/multi", 30, 2) == "runs/multi@2:30"
    for bad in ("demo", "=demo", "x="):
        with pytest.raises(SystemExit, match="expected NAME=PART"):
            ab.parse_arm(bad)


def test_arm_rows_unions_parts_and_drops_held_out_prompts(ab, tmp_path):
    pool = [conv(f"pool {i}") for i in range(5)]
    held = [conv("held A"), conv("held B")]
    extra = [conv("copy 0"), conv("held A", "a sampled answer"), conv("copy 1"), conv("copy 2")]
    d = regen_dir(tmp_path / "copy", extra)

    rows, report = ab.arm_rows([("demo", None, None), (str(d), None, None)], pool, held)
    # the demo pool whole, then the dir's rows less the one whose first user turn is a held-out prompt
    assert [r["messages"][0]["content"] for r in rows[:5]] == [f"pool {i}" for i in range(5)]
    assert sorted(r["messages"][0]["content"] for r in rows[5:]) == ["copy 0", "copy 1", "copy 2"]
    assert report == {"demo": {"rows": 5, "dropped_held_out": 0}, str(d): {"rows": 3, "dropped_held_out": 1}}

    # DIR:N takes the first N after one seed-0 shuffle of the dir (in shard order), held-out rows removed first
    rows, report = ab.arm_rows([(str(d), 2, None), ("demo", 3, None)], pool, held)
    order = list(extra)
    random.Random(0).shuffle(order)
    expect = [c["messages"][0]["content"] for c in order if c["messages"][0]["content"] != "held A"][:2]
    assert [r["messages"][0]["content"] for r in rows] == expect + ["pool 0", "pool 1", "pool 2"]
    assert report[f"{d}:2"] == {"rows": 2, "dropped_held_out": 1}


def test_arm_rows_refuses_a_dir_that_is_not_finished_regenerate_output(ab, tmp_path):
    half = regen_dir(tmp_path / "half", [conv("a"), conv("b")], complete=False)
    with pytest.raises(SystemExit, match="is not complete"):
        ab.arm_rows([(str(half), None, None)], [], [])
    with pytest.raises(SystemExit, match="is not a `draftsmith regenerate` output dir"):
        ab.arm_rows([(str(tmp_path), None, None)], [], [])


def test_turns_cut_each_conversation_to_its_first_exchanges(ab, tmp_path):
    sys_msg = {"role": "system", "content": "be brief"}
    three = {"id": "c", "messages": [sys_msg, *conv("q1", "a1")["messages"], *conv("q2", "a2")["messages"],
                                     *conv("q3", "a3")["messages"]]}
    assert ab.first_turns(three, 1)["messages"] == [sys_msg, *conv("q1", "a1")["messages"]]
    assert [m["content"] for m in ab.first_turns(three, 2)["messages"]] == ["be brief", "q1", "a1", "q2", "a2"]
    assert ab.first_turns(three, 5) == three and ab.first_turns(three, 1)["id"] == "c"
    d = regen_dir(tmp_path / "multi", [three, conv("q9", "a9")])
    rows, report = ab.arm_rows([(str(d), None, 1)], [], [])
    assert sorted(len(r["messages"]) for r in rows) == [2, 3] and report == {f"{d}@1": {"rows": 2, "dropped_held_out": 0}}


def test_multi_turn_keys_follow_the_single_turn_ones_and_a_reused_entry_is_scored_on_the_missing_only(ab, monkeypatch,
                                                                                                       tmp_path):
    import sys

    curve = sys.modules["data_curve"]  # data_ab imports it from bench/
    assert ab.eval_keys(["mt_bench", "mixed"], [1, 3], ["mt_bench"]) == [
        "mt_bench@K1", "mt_bench@K3", "mixed@K1", "mixed@K3", "mt_bench+turns@K1", "mt_bench+turns@K3"]
    assert ab.eval_keys(["mt_bench"], [1], []) == ["mt_bench@K1"]

    calls = []

    def fake_real_taus(draft, prompt_files, ks, max_new_tokens, multi_turn_sets=(), only=None):
        calls.append((draft, sorted(only)))
        return {k: {"tau": 2.0} for k in only}

    monkeypatch.setattr(curve, "real_taus", fake_real_taus)
    files = {"mt_bench": tmp_path / "a.jsonl", "mixed": tmp_path / "b.jsonl"}
    args = SimpleNamespace(k=[1], max_new_tokens=8, multi_turn_sets=["mt_bench"])
    entry = {"real": {"mt_bench@K1": {"tau": 1.5}, "mixed@K1": {"tau": 1.2}}}
    assert ab.fill_real(entry, files, args, fallback=tmp_path / "run") is True
    assert calls == [(tmp_path / "run", ["mt_bench+turns@K1"])]
    assert entry["real"]["mt_bench@K1"] == {"tau": 1.5} and entry["real"]["mt_bench+turns@K1"] == {"tau": 2.0}
    assert ab.fill_real(entry, files, args) is False and len(calls) == 1  # nothing missing: nothing runs
    entry["draft"] = str(tmp_path / "best")  # a recorded checkpoint wins over the fallback
    del entry["real"]["mixed@K1"]
    ab.fill_real(entry, files, args, fallback=tmp_path / "run")
    assert calls[-1] == (tmp_path / "best", ["mixed@K1"])
    with pytest.raises(SystemExit, match="rerun without --reuse"):
        ab.fill_real({"real": {}}, files, args)


def test_the_prompt_spread_keeps_every_turn_and_single_turn_readers_still_read_the_first(tmp_path):
    """The multi-turn scores (``<set>+turns``) read MT-Bench's second turns from this file: a spread that
    kept only first turns scored them equal to the single-turn ones (seen: every +turns figure equal)."""
    import sys

    from draftsmith.eval.prompts import load_prompts

    sys.path.insert(0, str(BENCH))
    from recipe_sweep import spread_prompts

    path = spread_prompts("mt_bench", 3, tmp_path / "p.jsonl")
    whole = load_prompts(str(path), multi_turn=True)
    assert [len(p.turns) for p in whole] == [2, 2, 2]
    assert len({p.category for p in whole}) == 3  # round-robin over the categories
    assert [p.turns for p in load_prompts(str(path))] == [p.turns[:1] for p in whole]
