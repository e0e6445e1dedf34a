"""Acceptance statistics against hand numbers; table, JSON and PNG outputs."""

import json

import pytest

from draftsmith.eval.report import acceptance_stats, build_report, format_table, write_report


def rec(pid, cat, accepted, n_tokens, spec_s, plain_s, match=True):
    return {"id": pid, "category": cat, "turn": 0, "prompt_tokens": 5, "token_ids": list(range(n_tokens)),
            "text": "t", "accepted": accepted, "spec_s": spec_s, "plain_s": plain_s, "plain_tokens": n_tokens,
            "matches_plain": match}


def test_acceptance_stats_by_hand():
    s = acceptance_stats([0, 2, 3, 1], k=3)
    # 4 drafts, 6 accepted; first-i-accepted counts: i=1 -> 3 rounds, i=2 -> 2, i=3 -> 1
    # conditional: position 1 accepted in 3 of 4 drafts, 2 in 2 of those 3, 3 in 1 of those 2
    assert s == {"drafts": 4, "accepted": 6, "tau": 2.5, "accepted_per_position": [3, 2, 1],
                 "acceptance_per_position": [0.75, 0.5, 0.25], "conditional_acceptance_per_position": [0.75, 2 / 3, 0.5]}
    assert acceptance_stats([], 2)["tau"] is None
    assert acceptance_stats([], 2)["conditional_acceptance_per_position"] == [None, None]
    assert acceptance_stats([0, 0], 2)["conditional_acceptance_per_position"] == [0.0, None]  # none reached 2


def test_report_rows_categories_and_speedup():
    records = [rec("a", "math", [3, 3], 8, 1.0, 2.0), rec("b", "math", [0, 1], 3, 1.0, 1.0),
               rec("c", "code", [2], 3, 0.5, 1.5, match=False)]
    r = build_report(records, k=3, config={"k": 3, "temperature": 0.0})
    o = r["overall"]
    assert o["drafts"] == 5 and o["accepted"] == 9 and o["tau"] == pytest.approx(2.8)
    assert o["acceptance_per_position"] == [0.8, 0.6, 0.4]
    assert o["spec_tokens_per_s"] == pytest.approx(14 / 2.5) and o["plain_tokens_per_s"] == pytest.approx(14 / 4.5)
    assert o["speedup"] == pytest.approx(4.5 / 2.5)
    assert r["categories"]["math"]["tau"] == 2.75 and r["categories"]["code"]["prompts"] == 1
    assert r["lossless"] == {"checked": 3, "mismatches": ["c#0"]}
    table = format_table(r)
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["category", "prompts", "drafts", "tau", "acc@1"]
    assert [l.split()[0] for l in lines[2:5]] == ["code", "math", "all"]
    assert "2.800" in lines[4] and "1.80x" in lines[4] and "MISMATCH in c#0" in table
    # accepted per position 4, 3, 2 of 5 drafts -> conditional 4/5, 3/4, 2/3
    assert o["conditional_acceptance_per_position"] == pytest.approx([0.8, 0.75, 2 / 3])
    assert "conditional acceptance (token i accepted when 1..i-1 were): 0.800 / 0.750 / 0.667" in table
    assert "draft-vocab coverage" not in table  # only for a pruned draft's offline report
    r["draft_vocab_coverage"] = 0.9875
    assert "draft-vocab coverage of the target's answer tokens: 0.988" in format_table(r)


def test_answer_coverage_counts_the_target_tokens_in_the_draft_vocab():
    import torch

    from draftsmith.eval.offline import answer_coverage

    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[1, 2, 3]] = True
    records = [{"token_ids": [1, 2, 9]}, {"token_ids": [3, 4]}, {"token_ids": []}]
    assert answer_coverage(records, t2d) == pytest.approx(3 / 5)  # 9 and 4 are outside
    assert answer_coverage([{"token_ids": []}], t2d) is None


def test_write_report_json_and_png(tmp_path):
    r = build_report([rec("a", "x", [1, 2], 5, 1.0, 1.0), rec("b", "y", [0], 1, 1.0, 1.0)], k=2)
    paths = write_report(r, tmp_path / "out")
    assert json.loads(paths["json"].read_text())["overall"]["tau"] == pytest.approx(2.0)
    png = paths["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
