"""Trial fusion (Hydro's inter-trial fusion on dagtune's stage tree): K trials of one model
that differ only in fusible hyper-parameters train as one stacked model.

`FusibleTrainer` declares a trainer by its parts; `FusedGroup` trains K of its trials in
lock step; `stack`/`split` convert between K unfused trainer states and one fused state.
"""

from dagtune.fusion._group import FusedGroup, FusionError, MemberModel
from dagtune.fusion._optimizers import SGD, AdamW, FusedAdamW, FusedOptimizer, FusedSGD, OptimizerSpec
from dagtune.fusion._state import TRAINER_STATE_KEYS, same_state, split, stack
from dagtune.fusion._trainer import FusibleTrainer, mean_loss

__all__ = [
    "SGD",
    "TRAINER_STATE_KEYS",
    "AdamW",
    "FusedAdamW",
    "FusedGroup",
    "FusedOptimizer",
    "FusedSGD",
    "FusibleTrainer",
    "FusionError",
    "MemberModel",
    "OptimizerSpec",
    "mean_loss",
    "same_state",
    "split",
    "stack",
]
