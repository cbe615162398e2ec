"""Handing restored trials back to an algorithm (`Study._take_restored`, issue 24): each submit
is one look-up, whatever the number of trials restored (counted: configs serialized per
take), and the trial handed back is the first restored with that config and steps."""

from __future__ import annotations

import dagtune as dt
from dagtune.config import normalize_config
from dagtune.records import Trial
from dagtune.study._restored import RestoredTrials


def trial(i: int, lr: float, steps: int = 4) -> Trial:
    return Trial(i, normalize_config({"lr": dt.Constant(lr)}), steps)


def test_a_take_serializes_one_config_however_many_trials_are_restored():
    per_take = {}
    for n in (100, 10_000):
        restored = RestoredTrials([trial(i, 0.001 * (i + 1)) for i in range(n)])
        assert restored.dumps == n and len(restored) == n
        before = restored.dumps
        taken = [restored.take(normalize_config({"lr": dt.Constant(0.001 * (i + 1))}), 4) for i in (0, n - 1)]
        assert [t.id for t in taken] == [0, n - 1]
        per_take[n] = (restored.dumps - before) / 2
    assert per_take == {100: 1.0, 10_000: 1.0}


def test_the_first_restored_with_the_config_and_steps_comes_back_once():
    restored = RestoredTrials([trial(0, 0.1), trial(1, 0.1, steps=8), trial(2, 0.1), trial(3, 0.2)])
    config = normalize_config({"lr": dt.Constant(0.1)})
    restored.add(trial(0, 0.1))  # restored again (an interrupted run): kept once
    assert len(restored) == 4 and 0 in restored
    assert [restored.take(config, 4).id, restored.take(config, 4).id] == [0, 2]
    assert restored.take(config, 4) is None and 0 not in restored
    assert restored.take(config, 8).id == 1
    assert restored.take(normalize_config({"lr": dt.Constant(0.3)}), 4) is None
    assert len(restored) == 1


def test_a_take_with_nothing_restored_serializes_nothing():
    restored = RestoredTrials()
    assert restored.take(normalize_config({"lr": dt.Constant(0.1)}), 4) is None
    assert restored.dumps == 0
