"""Trial fusion (Hydro's inter-trial fusion on dagtune's stage tree): K trials of one model
that differ only in fusible hyper-parameters train as one stacked model.

`FusibleTrainer` declares a trainer by its parts; `FusedGroup` trains K of its trials in
lock step; `stack`/`split` convert between K unfused trainer states and one fused state;
`check_fusion` checks, before a trainer's first fused task, that it fuses and exactly.
"""

from dagtune.fusion._adaptive import Adagrad, FusedAdagrad, FusedRMSprop, RMSprop
from dagtune.fusion._check import ATOL, RTOL, FusionVerdict, FusionWarning, check_fusion
from dagtune.fusion._count import (
    CpuMemory,
    CudaMemory,
    FusionProfile,
    MemoryProbe,
    fusion_count,
    profile_fusion,
)
from dagtune.fusion._group import FusedGroup, FusionError, MemberModel
from dagtune.fusion._grouping import can_fuse, fusion_conflict, fusion_groups
from dagtune.fusion._optimizers import (
    SGD,
    Adam,
    AdamW,
    FusedAdam,
    FusedOptimizer,
    FusedSGD,
    OptimizerSpec,
)
from dagtune.fusion._runner import FusedPathRunner
from dagtune.fusion._state import TRAINER_STATE_KEYS, same_state, split, stack
from dagtune.fusion._trace import ModuleTrace
from dagtune.fusion._trainer import FusibleTrainer, mean_loss

__all__ = [
    "ATOL",
    "RTOL",
    "SGD",
    "TRAINER_STATE_KEYS",
    "Adagrad",
    "Adam",
    "AdamW",
    "CpuMemory",
    "CudaMemory",
    "FusedAdagrad",
    "FusedAdam",
    "FusedGroup",
    "FusedOptimizer",
    "FusedPathRunner",
    "FusedRMSprop",
    "FusedSGD",
    "FusibleTrainer",
    "FusionError",
    "FusionProfile",
    "FusionVerdict",
    "FusionWarning",
    "MemberModel",
    "MemoryProbe",
    "ModuleTrace",
    "OptimizerSpec",
    "RMSprop",
    "can_fuse",
    "check_fusion",
    "fusion_conflict",
    "fusion_count",
    "fusion_groups",
    "mean_loss",
    "profile_fusion",
    "same_state",
    "split",
    "stack",
]
