"""The width-scaled byte-level LM trainer: its corpus comes from this machine's standard
library, it trains through ``dt.run_alone`` deterministically, and its widths scale."""

from __future__ import annotations

import pytest
from stdlib_lm import StdlibLMTrainer, stdlib_corpus

import dagtune as dt
from dagtune.trainer import build_trainer

KWARGS = {
    "base": 32,
    "heads": 2,
    "context": 16,
    "batches_per_step": 3,
    "train_bytes": 50_000,
    "val_bytes": 4_096,
}


def test_the_corpus_is_the_standard_library_split_by_file():
    train, val = stdlib_corpus(50_000, 4_096)
    assert (len(train), len(val)) == (50_000, 4_096)
    assert b"def " in train.tobytes() and b"import" in val.tobytes()
    with pytest.raises(ValueError, match="fewer than the"):
        stdlib_corpus(10**10, 4_096)


def test_it_trains_through_run_alone_deterministically():
    config = {"lr": dt.Cosine(0.01, 3), "beta1": 0.9}
    first = dt.run_alone(StdlibLMTrainer, config, 3, trainer_kwargs={**KWARGS, "scale": 2}, seed=0)
    assert first == dt.run_alone(StdlibLMTrainer, config, 3, trainer_kwargs={**KWARGS, "scale": 2}, seed=0)
    assert first[-1]["val_bpb"] < first[0]["val_bpb"] < 8  # below a uniform guess over 256 bytes


def test_model_and_head_widths_scale_and_the_vocabulary_does_not():
    for scale in (1, 4):
        model = build_trainer(StdlibLMTrainer, {**KWARGS, "scale": scale}, seed=0).model
        width = 32 // scale
        assert model.embedding.weight.shape == (256, width)
        assert model.readout.weight.shape == (256, width)
        assert model.blocks[0].attention.head_dim == width // 2
        assert model.blocks[0].mlp[0].weight.shape == (4 * width, width)
