"""The train bar under train.max_time_s: a total that settles although step times vary 4x, the exact
time left as its ETA, and a bar that ends full when the budget stops the run. A fake clock: no sleeps."""

from __future__ import annotations

import io
import itertools

import pytest

from draftsmith.train.progress import BudgetProgress, TrainBar

BUDGET = 400.0
WARMUP_S = 8.0  # the first step pays one-time costs
PATTERN = (1.0, 4.0, 1.0, 2.0)  # then 8 s per 4 steps: 2 s a step on average, 4x between steps
# 8 s + 49 cycles of 8 s = 400 s: the step that ends at the budget is step 1 + 49 * 4
LAST_STEP = 197


def drive(plan, step_times, start_step=0, total_steps=10_000, budget=BUDGET, bar=None, clock=None, elapsed=0.0):
    """What Trainer.run does after each step (to ``plan`` or to ``bar``, whose clock reads ``clock[0]``)
    -> [(step, elapsed, total, left)] up to the stop, or until ``step_times`` ends."""
    step, rows = start_step, []
    for dt in step_times:
        elapsed += dt
        step += 1
        stop = step >= total_steps or elapsed >= budget
        if bar is not None:
            clock[0] = elapsed
            bar.step(step, elapsed, stop)
            rows.append((step, elapsed, bar.total, bar.left_s))
        else:
            rows.append((step, elapsed, *plan.update(step, elapsed, stop)))
        if stop:
            break
    return rows


def demo_like_times():
    return itertools.chain([WARMUP_S], itertools.cycle(PATTERN))


@pytest.mark.parametrize("start_step", [0, 100])  # 100: a resumed run, the bar starting at its step
def test_total_settles_and_the_bar_ends_full_when_the_budget_does(start_step):
    rows = drive(BudgetProgress(BUDGET, 10_000, start_step), demo_like_times(), start_step)
    steps, elapsed, totals, lefts = map(list, zip(*rows))
    assert steps[-1] == totals[-1] == start_step + LAST_STEP and lefts[-1] == 0.0  # n == total at the stop
    assert lefts == [max(0.0, BUDGET - e) for e in elapsed]  # the ETA is the budget left, exactly
    assert all(a > b for a, b in zip(lefts, lefts[1:]))
    assert all(t >= s + 1 for s, t in zip(steps[:-1], totals[:-1]))  # never full before the stop
    # After step 1 only the warm-up is known: 8 s a step, 392 s left -> 49 more. After each 4-step
    # cycle the rate is exactly 2 s/step (the warm-up step left out) and the budget left an even
    # number of seconds: the total is then the final step itself.
    assert totals[0] == start_step + 1 + 49
    cycle_ends = [t for s, t in zip(steps[1:], totals[1:]) if (s - start_step - 1) % 4 == 0]
    assert len(cycle_ends) == 49 and set(cycle_ends) == {start_step + LAST_STEP}
    # After the first 10% of the budget (step 17, 17 of 197 steps) mid-cycle estimates stay within
    # 3% of it; the last-step rate would swing 4x, and the run-so-far rate with the 8 s warm-up
    # in it would start at 170 and creep up.
    late = [t - start_step for e, t in zip(elapsed, totals) if e >= BUDGET * 0.1]
    assert min(late) >= LAST_STEP - 6 and max(late) <= LAST_STEP + 6
    late = [t - start_step for e, t in zip(elapsed, totals) if e >= BUDGET * 0.5]
    assert min(late) >= LAST_STEP and max(late) <= LAST_STEP + 2


def test_first_steps_and_the_ceiling():
    # 3 s a step, budget 10 s: steps end at 3, 6, 9, 12 and the trainer stops after step 4 (12 >= 10)
    rows = drive(BudgetProgress(10.0, 1000), itertools.repeat(3.0), budget=10.0)
    assert rows == [(1, 3.0, 4, 7.0), (2, 6.0, 4, 4.0), (3, 9.0, 4, 1.0), (4, 12.0, 4, 0.0)]


def test_data_that_runs_out_before_the_budget():
    # 2 s a step, 50 steps of data, 400 s budget: the total is the data's end and the time left is
    # the steps left at the run's rate, not the budget
    rows = drive(BudgetProgress(BUDGET, 50), itertools.repeat(2.0), total_steps=50)
    assert rows[9] == (10, 20.0, 50, 80.0)
    assert rows[-1] == (50, 100.0, 50, 0.0)


def test_the_rendered_bar_shows_the_budget_left_and_ends_full():
    clock = [0.0]
    bar = TrainBar(10_000, 0, max_time_s=BUDGET, file=io.StringIO(), desc="train", unit="step", mininterval=0)
    bar._time, bar.start_t, bar.last_print_t = (lambda: clock[0]), 0.0, 0.0  # tqdm's own clock, faked
    assert "0/10000 step [00:00 elapsed, ETA 06:40" in str(bar)  # before the first step: the whole budget left
    times = demo_like_times()
    rows = drive(None, itertools.islice(times, 17), bar=bar, clock=clock)
    assert rows[-1] == (17, 40.0, 197, 360.0)
    # 17 steps in 40 s: tqdm's whole-run rate (smoothing 0), the budget's 6:00 left as the ETA
    assert str(bar) == "train:   9%|" + str(bar).split("|")[1] + "| 17/197 step [00:40 elapsed, ETA 06:00,  2.35s/step]"
    rows = drive(None, times, start_step=17, bar=bar, clock=clock, elapsed=40.0)
    assert rows[-1] == (LAST_STEP, BUDGET, LAST_STEP, 0.0)
    assert "100%" in str(bar) and f"{LAST_STEP}/{LAST_STEP} step [06:40 elapsed, ETA 00:00" in str(bar)
    bar.close()


def test_without_a_budget_the_bar_keeps_its_total():
    bar = TrainBar(30, 10, file=io.StringIO(), desc="train", unit="step")
    bar.step(11, 5.0, False)
    assert bar.total == 30 and bar.n == 11 and bar.left_s is None and bar.smoothing == 0
    bar.close()
