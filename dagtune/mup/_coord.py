"""The coordinate check: do activations and their updates keep their size across widths?

Under muP every layer's output coordinates, and the change training makes to them, stay of
the same size as the width grows (the coordinate check of Tensor Programs V; Hydro's
correctness check, §4.1).
`coord_check` trains the same model at several widths for a few steps on fixed batches and
records, for every leaf module at every step, the mean absolute value of its output on a
fixed probe batch (`size`) and of that output's change since step 0 (`change`). A module that
returns several tensors (``nn.GRU``, ``nn.LSTM``: ``(output, h_n)``, ``(output, (h_n,
c_n))``) is measured element by element, as ``rnn[0]``, ``rnn[1][0]``, ...; what it could not
measure (an output without floating-point tensors, such as None or indices) is listed in
`CoordCheck.skipped`.
`CoordCheck.exponents` fits each of them as ``c * width ** exponent``: exponents near zero
mean the sizes stay flat; an exponent near 1 (or -1) means they grow (shrink) with width,
which is what the standard parametrization shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from dagtune.mup._build import build
from dagtune.mup._layers import WidthAware
from dagtune.mup._shapes import Parametrization, WidthBuilder, check_width
from dagtune.trainer import seed_everything

__all__ = ["CoordCheck", "coord_check"]

#: ``loss(model, batch) -> scalar tensor``
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class CoordCheck:
    """Rows ``{"width", "step", "module", "size", "change"}`` of a coordinate check (sizes
    averaged over the seeds); `exponents` reads them. `skipped` names the outputs it did not
    measure (a module's output, or an element of it, that is not a floating-point tensor),
    each with what it was."""

    rows: tuple[dict[str, Any], ...]
    skipped: tuple[str, ...] = ()

    @property
    def widths(self) -> list[int]:
        return sorted({row["width"] for row in self.rows})

    def exponents(self, quantity: str = "size") -> dict[tuple[str, int], float]:
        """``(module, step) -> exponent`` of the least-squares fit ``log value = a + exponent *
        log width``. A quantity that is exactly zero at every width (a zero-initialized readout
        at step 0, any change at step 0) has exponent 0; one that is zero at some widths only
        has an infinite exponent."""
        if quantity not in ("size", "change"):
            raise ValueError(f"quantity must be 'size' or 'change', got {quantity!r}")
        series: dict[tuple[str, int], dict[int, float]] = {}
        for row in self.rows:
            series.setdefault((row["module"], row["step"]), {})[row["width"]] = row[quantity]
        result = {}
        for key, by_width in series.items():
            widths = sorted(by_width)
            values = np.array([by_width[w] for w in widths])
            if np.all(values == 0):
                result[key] = 0.0
            elif np.any(values <= 0) or not np.all(np.isfinite(values)):
                result[key] = float("inf")
            else:
                result[key] = float(np.polyfit(np.log(widths), np.log(values), 1)[0])
        return result


def _watched_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Leaf modules and width-aware ones (whose output is not a child's)."""
    return {
        name: module
        for name, module in model.named_modules()
        if name and (not any(True for _ in module.children()) or isinstance(module, WidthAware))
    }


def _probe(model: nn.Module, probe: Any, skipped: dict[str, str]) -> dict[str, torch.Tensor]:
    """Every watched module's floating-point outputs on `probe`, by name (a tuple's elements
    as ``name[i]``); what is not measured goes to `skipped` (name -> what it was)."""
    outputs: dict[str, torch.Tensor] = {}
    hooks = []
    for name, module in _watched_modules(model).items():

        def record(_module: nn.Module, _inputs: Any, output: Any, name: str = name) -> None:
            leaves, _ = pytree.tree_flatten_with_path(output)
            for path, leaf in leaves:
                key = name + pytree.keystr(path)
                if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
                    outputs[key] = leaf.detach().clone()
                else:
                    kind = f"a {leaf.dtype} tensor" if isinstance(leaf, torch.Tensor) else type(leaf).__name__
                    skipped[key] = kind
            if not leaves:
                skipped[name] = f"an empty {type(output).__name__}"

        hooks.append(module.register_forward_hook(record))
    try:
        with torch.no_grad():
            model(probe)
    finally:
        for hook in hooks:
            hook.remove()
    return outputs


def coord_check(
    make_model: WidthBuilder,
    base: int,
    scales: Sequence[float],
    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
    loss: LossFn,
    batches: Sequence[Any],
    probe: Any,
    parametrization: Parametrization = "mup",
    seeds: Sequence[int] = (0,),
) -> CoordCheck:
    """Train ``build(make_model, base, scale, parametrization)`` for ``len(batches)`` steps at
    every scale and seed (one optimizer step per batch, the optimizer from
    ``make_optimizer(model)``) and record the output sizes of every leaf module on `probe`
    before the first step and after each (a tuple's tensors element by element; the outputs
    it cannot measure are listed in `CoordCheck.skipped`). The model must be deterministic in
    its forward pass (no dropout), so that only training changes the probe's outputs."""
    if len(scales) < 2:
        raise ValueError(f"a coordinate check needs at least two scales, got {list(scales)}")
    if not seeds:
        raise ValueError("a coordinate check needs at least one seed")
    sums: dict[tuple[int, int, str], list[float]] = {}
    skipped: dict[str, str] = {}
    for scale in scales:
        width = check_width(base, scale)
        for seed in seeds:
            seed_everything(seed)
            model = build(make_model, base, scale, parametrization)
            optimizer = make_optimizer(model)
            first = _probe(model, probe, skipped)
            for step in range(len(batches) + 1):
                outputs = first if step == 0 else _probe(model, probe, skipped)
                for name, output in outputs.items():
                    size = output.abs().mean().item()
                    change = (output - first[name]).abs().mean().item()
                    totals = sums.setdefault((width, step, name), [0.0, 0.0])
                    totals[0] += size / len(seeds)
                    totals[1] += change / len(seeds)
                if step < len(batches):
                    optimizer.zero_grad(set_to_none=True)
                    loss(model, batches[step]).backward()
                    optimizer.step()
    rows = tuple(
        {"width": width, "step": step, "module": name, "size": size, "change": change}
        for (width, step, name), (size, change) in sums.items()
    )
    return CoordCheck(rows, tuple(f"{name} ({kind})" for name, kind in sorted(skipped.items())))
