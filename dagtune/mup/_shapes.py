"""Which dimensions of each parameter grow with the model's width, and by how much.

muP (Yang et al., "Tensor Programs V") scales initialization and learning rate per parameter
according to how many of its dimensions grow with width: none (*fixed*: e.g. the readout's
bias), one (*vector-like*: input weights, embeddings, biases, norm gains, readout weights) or
two (*matrix-like*: hidden weights). This module finds those dimensions by building the model
at two widths on the meta device and comparing shapes, so a trainer only writes its model as
a function of one width.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from torch import nn

from dagtune.validation import check_int, check_number

__all__ = [
    "PARAMETRIZATIONS",
    "Parametrization",
    "WidthBuilder",
    "WidthShape",
    "check_width",
    "iter_owned_parameters",
    "width_shapes",
]

Parametrization = Literal["mup", "sp"]
#: ``"mup"``: the maximal update parametrization; ``"sp"``: the standard one (PyTorch's defaults).
PARAMETRIZATIONS: tuple[str, ...] = ("mup", "sp")
#: Builds the model at the width it is given (an int).
WidthBuilder = Callable[[int], nn.Module]


@dataclass(frozen=True)
class WidthShape:
    """A parameter's shape at the base width and at its own width.

    Dimension 0 is the fan-out and dimension 1 (with any trailing kernel dimensions) the
    fan-in, as in ``nn.Linear`` and ``nn.ConvNd`` weights. `scaled` says which dimensions
    grow in proportion to the width.
    """

    base: tuple[int, ...]
    shape: tuple[int, ...]
    scaled: tuple[bool, ...]

    @property
    def kind(self) -> Literal["fixed", "vector", "matrix"]:
        """How many dimensions grow with width: none, one or two."""
        return ("fixed", "vector", "matrix")[sum(self.scaled)]

    def dim_mult(self, dim: int) -> float:
        """``shape[dim] / base[dim]``: how much wider than the base this dimension is."""
        return self.shape[dim] / self.base[dim]

    @property
    def width_mult(self) -> float:
        """The width multiplier of the one scaled dimension of a vector-like parameter (1 if fixed)."""
        if self.kind == "matrix":
            raise ValueError("a matrix-like parameter has a fan-in and a fan-out multiplier, not one")
        return next((self.dim_mult(d) for d, s in enumerate(self.scaled) if s), 1.0)

    @property
    def fan_in_mult(self) -> float:
        return self.dim_mult(1) if len(self.shape) > 1 else 1.0

    @property
    def fan_out_mult(self) -> float:
        return self.dim_mult(0)


def iter_owned_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Module, str, nn.Parameter]]:
    """``(qualified name, owning module, local name, parameter)`` for every parameter, once per owner."""
    for module_name, module in model.named_modules():
        for local, parameter in module.named_parameters(recurse=False):
            yield (f"{module_name}.{local}" if module_name else local), module, local, parameter


def _shape_table(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, _, _, p in iter_owned_parameters(model)}


def width_shapes(model: nn.Module, base_model: nn.Module, double_model: nn.Module) -> dict[str, WidthShape]:
    """The `WidthShape` of every parameter of `model`, by qualified name.

    `base_model` and `double_model` are the same architecture at the base width and at twice
    it: a dimension that doubles between them grows with width; one that does not change is
    fixed. Any other difference (a parameter present at one width only, a dimension that
    neither stays nor doubles, more than two growing dimensions, growing dimensions other than
    fan-out and fan-in) cannot be parametrized and raises a ValueError naming the parameter.
    A parameter shared by two modules (tied weights) is refused too.
    """
    shapes = _shape_table(model)
    base, double = _shape_table(base_model), _shape_table(double_model)
    if not (shapes.keys() == base.keys() == double.keys()):
        differ = sorted(set(shapes) ^ set(base) | set(base) ^ set(double))
        raise ValueError(f"the model's parameters differ between widths: {differ}")
    seen: dict[int, str] = {}
    for name, _, _, parameter in iter_owned_parameters(model):
        if id(parameter) in seen:
            raise ValueError(
                f"parameter {name} is the same tensor as {seen[id(parameter)]}: tied weights are not supported"
            )
        seen[id(parameter)] = name
    result = {}
    for name, shape in shapes.items():
        b, d = base[name], double[name]
        if not (len(shape) == len(b) == len(d)):
            raise ValueError(f"parameter {name} has shape {b} at the base width but {shape} at this width")
        scaled = []
        for dim, (at_base, at_double, here) in enumerate(zip(b, d, shape)):
            if at_double == 2 * at_base:
                scaled.append(True)
            elif at_double == at_base and here == at_base:
                scaled.append(False)
            else:
                raise ValueError(
                    f"dimension {dim} of parameter {name} is {at_base} at the base width, {at_double} at "
                    f"twice it and {here} here: muP needs every dimension fixed or proportional to width"
                )
        if sum(scaled) > 2 or (sum(scaled) == 2 and not (scaled[0] and scaled[1])):
            raise ValueError(
                f"parameter {name} of shape {b} grows with width in dimensions "
                f"{[i for i, s in enumerate(scaled) if s]}: muP handles fan-out (0) and fan-in (1) only"
            )
        result[name] = WidthShape(base=b, shape=shape, scaled=tuple(scaled))
    return result


def check_width(base: int, scale: float) -> int:
    """The width ``base / scale``, which must be a whole positive number."""
    check_int("base", base, minimum=1, note="the full model's width")
    check_number("scale", scale, above=0, finite=False, note="the width is base / scale")
    width = base / scale
    if width != int(width):
        raise ValueError(f"base {base} / scale {scale} = {width:g} is not a whole width")
    return int(width)
