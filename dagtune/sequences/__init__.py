"""Hyper-parameter sequences and their canonical, comparable form.

A sequence gives a hyper-parameter's value at every step ``t = 0, 1, 2, ...``. Two trials share
a prefix when their values are equal step by step, whatever way the sequences were written, so
every sequence compiles to a *canonical piecewise form*: a list of ``(start, primitive)``
pieces, each primitive a closed-form function of the step (a constant, a geometric decay, a
linear ramp, a cosine arc, a triangle wave). Values are always computed through that form, so
equal primitives guarantee equal values, and comparing two sequences costs one comparison per
piece rather than one per step: a 30,000-step BERT schedule is three pieces.

Primitives are canonical, so that sequences equal by value but written differently meet as
equal primitives rather than being compared step by step: a primitive whose value does not
depend on the step is a constant (a cosine arc or triangle whose two ends are equal, a cosine
of period 1, a geometric piece with ratio 1 or initial value 0, a ramp between equal ends);
a cosine arc keeps its origin modulo its period (its value depends on the step only through
that phase), so SGDR restarted at any multiple of its period is one primitive. A triangle
does so only when its cycle is a power of two: torch's formula rounds differently at
different cycles otherwise, and such triangles really differ in the last bit.

Values must be finite: a value that overflows (``Exponential(0.1, 10.0)`` at step 309) or is
infinite or NaN is a ValueError naming the sequence and the step, on evaluation and when a
comparison (`first_difference`) covers that step.

Equality of values is exact and type-aware: ``128`` (an int) and ``128.0`` are different
values, because a trainer may treat them differently (a batch size must be an int).
"""

from dagtune.sequences._base import Sequence, dumps, first_difference
from dagtune.sequences._checks import Scalar, same_value
from dagtune.sequences._named import (
    Constant,
    Cosine,
    Cyclic,
    Exponential,
    Linear,
    MultiStep,
    Piecewise,
    Steps,
    Warmup,
    as_sequence,
)

__all__ = [
    "Constant",
    "Cosine",
    "Cyclic",
    "Exponential",
    "Linear",
    "MultiStep",
    "Piecewise",
    "Scalar",
    "Sequence",
    "Steps",
    "Warmup",
    "as_sequence",
    "dumps",
    "first_difference",
    "same_value",
]
