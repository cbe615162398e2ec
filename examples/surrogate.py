"""A surrogate study of the digits CNN: tune at 1/8 of the width, train the full model once.

Hydro's recipe (§4.1): under muP (`dagtune.mup`) the learning rate and momentum best for the
CNN of `examples/scaled_digits.py` at width ``64 / 8`` are best at width 64 too, and an epoch
of the narrow model costs a tenth of the full one's on a CPU. So the grid of lr x momentum
runs on the surrogate (study ``digits-surrogate``, ``scale=8``) and its best configuration
trains the full model once (study ``digits-surrogate-target``). With eager transfer the
target starts as soon as half the grid has finished, with the best so far, and starts again
if a later trial beats it.

    python examples/surrogate.py [--scale 8] [--epochs 6] [--no-eager]
    dagtune run examples/surrogate.py [--surrogate 4]

Weight decay and dropout are left out of the grid: their best values depend on the width
(they do not transfer), so a surrogate search that varied them would be warned about.
"""

from __future__ import annotations

import argparse
from typing import Any

from scaled_digits import BASE_WIDTH, ScaledDigitsTrainer

import dagtune as dt
from dagtune.algos import GridSearch
from dagtune.launch import StudySetup

NAME = "digits-surrogate"


def search_space(
    lr_exponents: range = range(-6, 0), momenta: tuple[float, ...] = (0.8, 0.9, 0.95)
) -> dt.Grid:
    """Learning rates 2**k x momenta: 18 configs by default, every one trained from scratch."""
    return dt.Grid({"lr": [2.0**k for k in lr_exponents], "momentum": list(momenta)})


def study_setup(epochs: int = 6, scale: int = 8) -> StudySetup:
    """What ``dagtune run examples/surrogate.py`` runs: the grid on the surrogate at `scale`,
    then the full CNN (eager transfer at half the grid)."""
    algorithm = GridSearch(search_space(), metric="val_loss", mode="min", steps=epochs)
    return StudySetup(
        trainer=ScaledDigitsTrainer,
        algorithm=algorithm,
        name=NAME,
        trainer_kwargs={"base": BASE_WIDTH},
        surrogate=dt.Surrogate(scale=scale, eager=0.5),
    )


def tune(
    scale: int = 8,
    epochs: int = 6,
    storage: str = "./dagtune-runs",
    *,
    eager: float | None = 0.5,
    space: dt.Grid | None = None,
    base: int = BASE_WIDTH,
    name: str = NAME,
    **study_options: Any,
) -> dt.SurrogateResult:
    """Run the surrogate study (`study_options`: `client`, `workers`, ... of `dt.Study`)."""
    algorithm = GridSearch(space or search_space(), metric="val_loss", mode="min", steps=epochs)
    with dt.SurrogateStudy(
        ScaledDigitsTrainer,
        {"base": base},
        dt.Surrogate(scale=scale, eager=eager),
        name=name,
        storage=storage,
        **study_options,
    ) as study:
        return study.run(algorithm)


def main(argv: list[str] | None = None) -> dt.SurrogateResult:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=8, help="width divisor of the surrogate (default 8)")
    parser.add_argument(
        "--epochs", type=int, default=6, help="epochs per trial and for the target (default 6)"
    )
    parser.add_argument("--no-eager", action="store_true", help="train the target only after the whole grid")
    parser.add_argument("--storage", default="./dagtune-runs", help="checkpoint storage URL or directory")
    parser.add_argument(
        "--scheduler", help="address of a running `dask scheduler` (default: a local cluster)"
    )
    parser.add_argument("--workers", type=int, help="workers of the local cluster (default: one per core)")
    args = parser.parse_args(argv)

    client = None
    if args.scheduler:
        from distributed import Client

        client = Client(args.scheduler)
    result = tune(
        args.scale,
        args.epochs,
        args.storage,
        eager=None if args.no_eager else 0.5,
        client=client,
        workers=args.workers,
    )
    searched, report = result.surrogate, result.surrogate.report
    best = searched.best
    print(
        f"surrogate (width {BASE_WIDTH // args.scale}): best of {report['trials']} trials val_loss "
        f"{best.metrics['val_loss']:.4f}, {report['executed_steps']} epochs in {report['makespan_seconds']:.1f} s"
    )
    for name, sequence in result.config.items():
        print(f"  {name:9s} {sequence!r}")
    target = result.target
    print(
        f"target (width {BASE_WIDTH}): val_loss {target.metrics['val_loss']:.4f}, val_acc "
        f"{target.metrics['val_acc']:.4f} after {target.steps} epochs ({result.restarts} eager restarts)"
    )
    return result


if __name__ == "__main__":
    main()
