"""data/advice.py: the rule of thumb the demo and `advise` quote, read from a checkpoint's meta.json."""

from __future__ import annotations

from draftsmith.data.advice import PER_DOUBLING, data_rule, data_rule_of, data_seen


def test_passes_are_the_epochs_done_plus_the_position_in_the_current_one():
    meta = {"data_order": {"train conversations": 40}, "data_epoch": 2, "row_pos": 10}
    assert data_seen(meta) == (40, 2.25)
    assert data_seen({"data_order": {"train conversations": 40}, "data_epoch": 0}) == (40, 0.0)


def test_a_meta_that_does_not_record_its_data_gives_no_line():
    assert data_seen({}) is None and data_rule_of({}) is None  # a vLLM export, a draft trained elsewhere
    assert data_seen({"data_order": {"train conversations": 0}, "data_epoch": 1}) is None
    assert data_seen({"data_order": {}, "data_epoch": 1}) is None


def test_below_one_pass_the_rule_asks_for_more_steps_first():
    line = data_rule(291, 0.5)
    assert line.startswith("0.50 passes over 291 conversations: it has not seen all its data yet")
    assert "regenerate" not in line


def test_between_one_and_two_passes_the_rule_says_either_pays():
    line = data_rule(1000, 1.5)
    assert line.startswith("1.50 passes over 1000 conversations: up to about 2 passes, more passes and new "
                           "conversations trained about level")
    assert "regenerate about" not in line


def test_past_two_passes_the_rule_asks_for_twice_the_conversations_and_quotes_the_curve():
    line = data_rule_of({"data_order": {"train conversations": 144}, "data_epoch": 3, "row_pos": 72})
    assert line.startswith("3.50 passes over 144 conversations: at a fixed step budget new conversations beat "
                           "repeated passes")
    assert "regenerate about 288 conversations" in line
    for name, gain in PER_DOUBLING.items():
        assert f"+{gain:.3f} on {name}" in line
