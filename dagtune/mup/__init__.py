"""Width-scaled models under the maximal update parametrization (muP), for surrogate tuning.

Yang et al. ("Tensor Programs V") show that under muP the optimal learning rate, schedule,
momentum and batch size of a network barely move as its width changes; Hydro (§4.1) tunes a
model whose hidden widths are divided by a scale S and trains the full model once with the
winner. A trainer writes its model as a function of the width and builds it with `build`::

    def make_model(width):
        return nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             dt.mup.Readout(width, 10))

    model = dt.mup.build(make_model, base=256, scale=8)        # width 32, muP ("sp": standard)
    optimizer = dt.mup.SGD(model, lr=0.1, momentum=0.9)        # or dt.mup.Adam / AdamW
    dt.mup.set_hyperparameters(optimizer, lr=0.05)             # in Trainer.setup

The rules, what transfers and what does not are in docs/surrogate.md.
"""

from dagtune.mup._build import build, parametrization_of, shapes
from dagtune.mup._coord import CoordCheck, coord_check
from dagtune.mup._layers import Readout, SelfAttention, WidthAware
from dagtune.mup._optim import (
    LR_MULT,
    SGD,
    WEIGHT_DECAY_MULT,
    Adam,
    AdamW,
    OptimizerKind,
    lr_multiplier,
    param_groups,
    set_hyperparameters,
)
from dagtune.mup._shapes import PARAMETRIZATIONS, Parametrization, WidthShape

__all__ = [
    "LR_MULT",
    "PARAMETRIZATIONS",
    "SGD",
    "WEIGHT_DECAY_MULT",
    "Adam",
    "AdamW",
    "CoordCheck",
    "OptimizerKind",
    "Parametrization",
    "Readout",
    "SelfAttention",
    "WidthAware",
    "WidthShape",
    "build",
    "coord_check",
    "lr_multiplier",
    "param_groups",
    "parametrization_of",
    "set_hyperparameters",
    "shapes",
]
