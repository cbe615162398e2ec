"""Search spaces: Grid and Random, distributions, and trial accounting helpers."""

from __future__ import annotations

import collections
import itertools
import tracemalloc

import pytest

import dagtune as dt


def test_grid_is_the_product_in_order():
    lrs = [dt.Constant(0.1), dt.MultiStep(0.1, [30, 45], 0.1)]
    grid = dt.Grid({"lr": lrs, "wd": [1e-4, 1e-3], "opt": ["sgd", "adam", "sgd-momentum"]})
    configs = list(grid)
    assert len(grid) == len(configs) == 12
    # the first hyper-parameter varies slowest, like itertools.product; names come out sorted
    expected = [
        {"lr": lr, "opt": dt.Constant(opt), "wd": dt.Constant(wd)}
        for lr, wd, opt in itertools.product(lrs, [1e-4, 1e-3], ["sgd", "adam", "sgd-momentum"])
    ]
    assert configs == expected
    assert all(list(c) == ["lr", "opt", "wd"] for c in configs)
    assert grid.names == ("lr", "opt", "wd")
    assert list(grid) == configs  # re-iterable, same configs


def test_grid_single_candidate_and_type_aware_values():
    grid = dt.Grid({"bs": [128, 128.0], "lr": 0.1})
    assert list(grid) == [
        {"bs": dt.Constant(128), "lr": dt.Constant(0.1)},
        {"bs": dt.Constant(128.0), "lr": dt.Constant(0.1)},
    ]


def test_grid_configs_are_copies():
    grid = dt.Grid({"lr": [0.1, 0.01]})
    first = next(iter(grid))
    first["lr"] = dt.Constant(5.0)
    assert next(iter(grid))["lr"] == dt.Constant(0.1)


def test_grid_where_filters_conditionals():
    grid = dt.Grid(
        {"opt": ["sgd", "sgd-momentum"], "momentum": [0.0, 0.9]},
        where=lambda c: (c["opt"] == "sgd-momentum") == (c["momentum"] != 0.0),
    )
    assert [(c["opt"](0), c["momentum"](0)) for c in grid] == [("sgd", 0.0), ("sgd-momentum", 0.9)]
    assert len(grid) == 2


def test_where_sees_plain_values_for_constants_and_sequences_for_schedules():
    """A user writes ``c["opt"] == "adam"``: constants (plain or `dt.Constant`) arrive as
    their values, schedules as sequences; what is kept are ordinary configs."""
    seen = []

    def keep(c):
        seen.append(c)
        return c["opt"] == "adam" or isinstance(c["lr"], dt.Sequence)

    grid = dt.Grid(
        {"opt": ["adam", "sgd"], "lr": [dt.Constant(0.1), dt.MultiStep(0.1, [5], 0.1)], "bs": 64}, where=keep
    )
    kept = [(c["opt"](0), c["lr"]) for c in grid]
    assert kept == [
        ("adam", dt.Constant(0.1)),
        ("adam", dt.MultiStep(0.1, [5], 0.1)),
        ("sgd", dt.MultiStep(0.1, [5], 0.1)),
    ]
    assert {"opt": "sgd", "lr": 0.1, "bs": 64} in seen
    assert all(type(c["bs"]) is int and type(c["opt"]) is str for c in seen)
    space = dt.Random(
        {"opt": dt.choice(["adam", "sgd"]), "lr": dt.loguniform(1e-3, 1e-1)},
        n=20,
        where=lambda c: c["opt"] == "adam" and c["lr"] < 0.01,
    )
    assert all(c["opt"](0) == "adam" and c["lr"](0) < 0.01 for c in space)


def test_grid_filter_removing_everything_is_an_error():
    with pytest.raises(ValueError, match="removed all 4 configs"):
        dt.Grid({"lr": [0.1, 0.01], "wd": [0.0, 1e-4]}, where=lambda c: False)


def heap_peak(call) -> tuple[int, object]:
    tracemalloc.start()
    try:
        result = call()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


def candidates(side: int) -> dict[str, list[float]]:
    return {"lr": [1e-4 * (i + 1) for i in range(side)], "momentum": [i / side for i in range(side)]}


def test_a_million_config_grid_is_read_as_it_goes():
    """Building the grid and a GridSearch holds the candidates, not the product."""
    from dagtune.algos import GridSearch

    used, grid = heap_peak(lambda: dt.Grid(candidates(1000)))
    assert used < 2 * 2**20 and len(grid) == 10**6
    used, search = heap_peak(lambda: GridSearch(grid, metric="loss", steps=2))
    assert used < 2**20
    submitted = list(itertools.islice(search.start(dt.algos.Context(slots=2, seed=0)), 3))
    assert [(s.config, s.steps) for s in submitted] == [(c, 2) for c in itertools.islice(grid, 3)]
    assert next(iter(grid)) == {"lr": dt.Constant(1e-4), "momentum": dt.Constant(0.0)}


def test_iterating_a_grid_holds_one_config_at_a_time():
    grid = dt.Grid(candidates(300))  # 90,000 configs: tens of MB if held in a list
    used, last = heap_peak(lambda: collections.deque(grid, maxlen=1)[0])
    assert used < 2**20 and last == {"lr": dt.Constant(1e-4 * 300), "momentum": dt.Constant(299 / 300)}


def test_a_filtered_grid_is_counted_only_when_asked():
    """`where` runs up to the first kept config at construction; ``len`` is one pass; an
    algorithm drawing configs lazily (ASHA) never asks for it."""
    calls = []

    def keep(config):
        calls.append(1)
        return config["momentum"] >= 0.5

    grid = dt.Grid(candidates(300), where=keep)
    assert len(calls) == 151  # momentum 0 .. 0.5 for the first learning rate
    dt.algos.ASHA(grid, metric="loss", min_steps=1, max_steps=9)
    drawn = len(calls)
    assert drawn < 400  # its first configs, not a count of the space
    assert len(grid) == 300 * 150 and len(calls) == drawn + 300 * 300
    assert len(grid) == 300 * 150 and len(calls) == drawn + 300 * 300  # counted once


@pytest.mark.parametrize(
    ("candidates", "match"),
    [
        ({}, "non-empty dict"),
        ({"lr": []}, r"Grid\['lr'\] has no candidates"),
        ({"lr": [dt.loguniform(1e-3, 1e-1)]}, r"Grid\['lr'\] holds a distribution.*dt.Random"),
        ({"lr": [[0.1, 0.2]]}, r"Grid\[\'lr\'\] must be a sequence or a JSON scalar"),
        ({"bad name": [0.1]}, "hyper-parameter names must be identifiers"),
    ],
)
def test_grid_rejects_bad_candidates(candidates, match):
    with pytest.raises(ValueError, match=match):
        dt.Grid(candidates)


def sampled_values(space, step=0):
    return [{name: seq(step) for name, seq in config.items()} for config in space]


def test_random_is_reproducible_for_a_seed():
    space = {"lr": dt.loguniform(1e-3, 1e-1), "bs": dt.choice([64, 128]), "wd": dt.uniform(0.0, 1e-3)}
    a = list(dt.Random(space, n=20, seed=7))
    assert a == list(dt.Random(space, n=20, seed=7))
    assert a == list(dt.Random(space, n=20, seed=7))  # and re-iterable
    assert a != list(dt.Random(space, n=20, seed=8))
    assert len(dt.Random(space, n=20, seed=7)) == 20


def test_random_distributions_as_plain_values():
    space = dt.Random(
        {
            "lr": dt.loguniform(1e-3, 1e-1),
            "bs": dt.choice([64, 128]),
            "wd": dt.uniform(0.0, 1e-3),
            "depth": dt.randint(2, 5),
            "opt": "sgd",
        },
        n=200,
        seed=0,
    )
    rows = sampled_values(space)
    assert all(1e-3 <= r["lr"] < 1e-1 and type(r["lr"]) is float for r in rows)
    assert {r["bs"] for r in rows} == {64, 128} and all(type(r["bs"]) is int for r in rows)
    assert all(0.0 <= r["wd"] < 1e-3 for r in rows)
    assert {r["depth"] for r in rows} == {2, 3, 4} and all(type(r["depth"]) is int for r in rows)
    assert {r["opt"] for r in rows} == {"sgd"}
    # log-uniform: about half the draws below the geometric mean 1e-2
    assert 60 < sum(r["lr"] < 1e-2 for r in rows) < 140


def test_random_distribution_as_sequence_argument():
    space = dt.Random({"lr": dt.MultiStep(dt.loguniform(1e-3, 1e-1), [30, 45], 0.1)}, n=50, seed=1)
    inits = set()
    for config in space:
        lr = config["lr"]
        assert isinstance(lr, dt.MultiStep) and lr.milestones == (30, 45) and lr.gamma == 0.1
        assert 1e-3 <= lr.init < 1e-1
        assert lr(30) == lr.init * 0.1 and lr(45) == lr.init * 0.1**2
        inits.add(lr.init)
    assert len(inits) == 50


def test_random_nested_templates_and_choice_among_sequences():
    options = [
        dt.Constant(0.1),
        dt.Warmup(5, dt.Exponential(dt.uniform(0.05, 0.2), 0.95)),
        dt.Cosine(0.1, dt.randint(10, 30)),
    ]
    configs = list(dt.Random({"lr": dt.choice(options), "bs": 128}, n=300, seed=3))
    kinds = {type(c["lr"]) for c in configs}
    assert kinds == {dt.Constant, dt.Warmup, dt.Cosine}
    for config in configs:
        lr = config["lr"]
        if isinstance(lr, dt.Warmup):
            assert lr.steps == 5 and 0.05 <= lr.then.init < 0.2 and lr(5) == lr.then.init
        if isinstance(lr, dt.Cosine):
            assert 10 <= lr.period < 30 and type(lr.period) is int
        lr.to_json()  # sampled: no distribution left


def test_templates_and_distributions_are_hashable():
    template = dt.MultiStep(dt.choice([0.1, 0.2]), [3], 0.1)
    again = dt.MultiStep(dt.choice((0.1, 0.2)), [3], 0.1)
    assert template == again and hash(template) == hash(again)
    assert len({template, again, dt.MultiStep(dt.choice([0.1, 0.3]), [3], 0.1)}) == 2
    assert repr(template) == "MultiStep(choice([0.1, 0.2]), [3], 0.1)"
    assert eval(repr(template), vars(dt)) == template
    # options holding lists, dicts and sequences hash too; type-aware like sequences
    nested = dt.choice([[30, 45], {"lr": [0.1]}, dt.Cosine(0.1, dt.randint(10, 30))])
    assert hash(nested) == hash(dt.choice([[30, 45], {"lr": [0.1]}, dt.Cosine(0.1, dt.randint(10, 30))]))
    assert dt.choice([128]) != dt.choice([128.0]) and dt.choice([1]) != dt.choice([True])
    space = {"lr": template, "wd": dt.loguniform(1e-5, 1e-3), "bs": dt.choice([64, 128])}
    assert len({frozenset(space.items()), frozenset(dict(space).items())}) == 1


def test_random_where_redraws():
    space = dt.Random({"lr": dt.uniform(0.0, 1.0)}, n=30, seed=0, where=lambda c: c["lr"] > 0.5)
    assert all(c["lr"](0) > 0.5 for c in space) and len(list(space)) == 30
    with pytest.raises(ValueError, match="rejected 10 draws in a row"):
        dt.Random({"lr": dt.uniform(0.0, 1.0)}, where=lambda c: False, max_rejections=10)


def test_random_endless_sampler():
    space = dt.Random({"lr": dt.uniform(0.0, 1.0)}, n=None, seed=4)
    first = list(itertools.islice(iter(space), 5))
    assert first == list(itertools.islice(space.sampler(), 5)) == list(dt.Random(space.space, n=5, seed=4))
    with pytest.raises(TypeError):
        len(space)


def test_random_rejects_lists_with_a_helpful_message():
    with pytest.raises(ValueError, match=r"Random\['bs'\] is a list.*write dt.choice\(\[64, 128\]\)"):
        dt.Random({"bs": [64, 128]})


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: dt.Random({}), "non-empty dict"),
        (lambda: dt.Random({"lr": 0.1}, n=0), r"Random\.n must be a positive int or None, got 0"),
        (lambda: dt.loguniform(0.0, 1.0), r"loguniform\.low must be positive, got 0\.0"),
        (lambda: dt.uniform(1.0, 1.0), r"uniform\.high must be greater than low"),
        (lambda: dt.uniform(0.0, float("inf")), r"uniform\.high must be finite"),
        (lambda: dt.randint(1.5, 3), r"randint\.low must be an int, got 1\.5"),
        (lambda: dt.choice([]), r"choice\.options must not be empty"),
    ],
)
def test_bad_random_spaces(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_unique_steps_and_merge_rate_of_a_grid():
    # two learning rates sharing [0, 30): 30 + 2 * 30 unique steps for 2 * 60 trial steps
    grid = dt.Grid({"lr": [dt.MultiStep(0.1, [30], 0.1), dt.MultiStep(0.1, [30], 0.5)], "wd": 1e-4})
    trials = [(c, 60) for c in grid]
    assert dt.unique_steps(trials) == 90
    assert dt.merge_rate(trials) == pytest.approx(120 / 90)
    # equal values written differently are one trial's worth of steps
    same = [({"lr": dt.Exponential(0.1, 1.0)}, 50), ({"lr": 0.1}, 50), ({"lr": dt.Constant(0.1)}, 20)]
    assert dt.unique_steps(same) == 50 and dt.merge_rate(same) == pytest.approx(120 / 50)


def test_merge_rate_of_no_trials_is_an_error():
    with pytest.raises(ValueError, match="no trials"):
        dt.merge_rate([])
    with pytest.raises(ValueError, match="no trials"):
        dt.merge_rate(c for c in [])
    assert dt.unique_steps([]) == 0  # a sum of nothing is 0


def test_unique_steps_rejects_configs_of_different_hyper_parameters():
    with pytest.raises(ValueError, match=r"must name the same hyper-parameters.*\['lr'\].*\['lr', 'wd'\]"):
        dt.unique_steps([({"lr": 0.1}, 10), ({"lr": 0.1, "wd": 0.0}, 10)])


@pytest.mark.parametrize("steps", [0, -5, 2.0, True])
def test_unique_steps_rejects_bad_step_counts(steps):
    with pytest.raises(ValueError, match="steps must be a positive int"):
        dt.unique_steps([({"lr": 0.1}, steps)])
