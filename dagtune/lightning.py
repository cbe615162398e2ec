"""`LightningTrainer`: tune an existing Lightning ``LightningModule`` as it is.

dagtune drives the module itself, without a Lightning ``Trainer`` (which owns its loop,
checkpoints and devices, and can neither resume bit for bit in the middle of a study nor
branch): it calls the module's ``configure_optimizers``, ``training_step``,
``validation_step`` and epoch hooks, and reads the data from the module's
``LightningDataModule`` (``prepare_data``, ``setup("fit")``, ``train_dataloader``,
``val_dataloader``) or from the module's own dataloader methods.

- **A step** is one epoch of the training data, or `batches_per_step` batches (crossing
  epochs, as `dagtune.ResumableBatches.take` does).
- **Data order**: the training loader's dataset, batch size, collate function, shuffle and
  drop_last are kept, but the order is dagtune's `ResumableBatches` (a permutation per epoch
  drawn from the study seed, saved in every checkpoint), so a trial resumes in the middle
  of an epoch and its batch size can change at any step. Loaders are read in this process
  (``num_workers`` is not used: Dask's worker processes can't start their own).
- **Hyper-parameters** reach the module through `apply_hyperparameters` (override it for
  anything else): a key of the optimizers' param groups (``lr``, ``momentum``,
  ``weight_decay``, ``eps``, ...) is set in every group that has it; ``batch_size`` is the
  training batch size; a name listed in `module_hparams` (values the module reads while it
  trains, e.g. ``self.hparams.label_smoothing`` in ``training_step``) is set in the
  module's ``hparams`` and as its attribute where it has one. Any other name is an error
  naming it: a typo, or a value the module only reads in ``__init__`` (a layer's width,
  ``nn.Dropout``'s ``p``) that setting afterwards would silently not change (make it a
  trainer argument, ``module_kwargs``, or apply it in an override). Tuning ``lr`` while
  ``configure_optimizers`` returns an LR scheduler is refused: dagtune's sequences are the
  schedule.
- **Metrics**: what the module logs with ``self.log`` / ``self.log_dict`` during a step's
  training batches (their mean, weighted by batch size as Lightning's ``on_epoch`` does;
  ``reduce_fx`` ``"sum"``, ``"max"`` and ``"min"`` work too) and during validation; plus
  ``loss``, the mean training loss, unless the module logs a metric of that name.
  torchmetrics objects logged are computed and reset at the end of the step or validation.
- **State**: the module's ``state_dict``, the optimizers' and schedulers', the data order,
  the counters, the datamodule's ``state_dict`` and whatever ``on_save_checkpoint`` adds
  (read back by ``on_load_checkpoint``): everything to resume bit for bit. With dagtune's
  RNG states this makes every trial exactly ``dt.run_alone``'s.

Not supported: manual optimization (``automatic_optimization = False``), more than one
optimizer, ``ReduceLROnPlateau`` and schedulers that monitor a metric, gradient accumulation,
and module code that reaches for ``self.trainer`` (``self.current_epoch`` and
``self.global_step`` read 0 without one; this trainer's `epoch` and `global_step` hold
them). Gradient clipping is `gradient_clip_val` / `gradient_clip_algorithm`, as on
Lightning's ``Trainer``.

Nothing here imports Lightning: the module and datamodule are used through their methods,
so ``pytorch_lightning`` and ``lightning`` modules both work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import torch

from dagtune.trainer import ResumableBatches, Trainer
from dagtune.validation import check_int

__all__ = ["LightningTrainer"]

_REDUCE = ("mean", "sum", "max", "min")


def _batch_size(batch: Any) -> int:
    """The size of a batch as Lightning infers it: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item)
            if size:
                return size
    return 0


class _Logged:
    """What a module logs during one phase (a step's training batches, or a validation):
    per name, the values and their weights, and torchmetrics objects to compute at the end."""

    def __init__(self) -> None:
        self.values: dict[str, list[tuple[float, int]]] = {}
        self.reduce: dict[str, str] = {}
        self.metrics: dict[str, Any] = {}
        self.batch_size = 1
        self.suffix = ""

    def log(
        self, name: str, value: Any, *, reduce_fx: Any = "mean", batch_size: int | None = None, **_: Any
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"self.log needs a metric name string, got {name!r}")
        name = name + self.suffix
        if hasattr(value, "compute") and hasattr(value, "reset"):  # a torchmetrics Metric
            self.metrics[name] = value
            return
        if callable(reduce_fx):  # torch.mean, torch.sum, ... as Lightning takes them
            reduce_fx = getattr(reduce_fx, "__name__", reduce_fx)
        if reduce_fx not in _REDUCE:
            raise ValueError(
                f"self.log({name!r}, reduce_fx={reduce_fx!r}): dagtune reduces with {list(_REDUCE)}"
            )
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}) got a tensor of shape {tuple(value.shape)}, not one number"
                )
            value = value.detach().item()
        self.values.setdefault(name, []).append((float(value), batch_size or self.batch_size))
        self.reduce[name] = reduce_fx

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def result(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, pairs in self.values.items():
            values = [v for v, _ in pairs]
            how = self.reduce[name]
            if how == "mean":
                total = sum(w for _, w in pairs)
                out[name] = sum(v * w for v, w in pairs) / total if total else math.nan
            else:
                out[name] = {"sum": sum, "max": max, "min": min}[how](values)
        for name, metric in self.metrics.items():
            value = metric.compute()
            out[name] = float(value.item() if isinstance(value, torch.Tensor) else value)
            metric.reset()
        return out


class LightningTrainer(Trainer):
    """A `dagtune.Trainer` around a ``LightningModule`` (see the module docstring).

    Subclass it naming the module (and data) classes, so that the study's trainer is an
    importable class::

        class DigitsTuning(dt.LightningTrainer):
            module_class = DigitsClassifier        # a LightningModule, as it is
            datamodule_class = DigitsDataModule    # optional: else the module's dataloaders

    and give the arguments as trainer arguments:
    ``trainer_kwargs={"module_kwargs": {"hidden": 64}, "datamodule_kwargs": {...}}``.
    List in `module_hparams` the hyper-parameters the module reads from ``self.hparams``
    while it trains; override `make_module` / `make_datamodule` to build them some other
    way, and `apply_hyperparameters` to apply a hyper-parameter the default does not know.

    `batches_per_step`: None, a step is an epoch; k, a step is k batches. `device`: where
    the module trains (default: CUDA when available, else the CPU).
    """

    module_class: ClassVar[type | None] = None
    datamodule_class: ClassVar[type | None] = None
    #: hyper-parameters the module reads from ``self.hparams`` (or its attributes) while it
    #: trains, which `apply_hyperparameters` sets there
    module_hparams: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        module_kwargs: Mapping[str, Any] | None = None,
        datamodule_kwargs: Mapping[str, Any] | None = None,
        batches_per_step: int | None = None,
        seed: int = 0,
        device: str | None = None,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ):
        check_int("batches_per_step", batches_per_step, minimum=1, optional=True, note="an epoch")
        if gradient_clip_algorithm not in ("norm", "value"):
            raise ValueError(
                f"gradient_clip_algorithm must be 'norm' or 'value', got {gradient_clip_algorithm!r}"
            )
        self.batches_per_step = batches_per_step
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.module = self.make_module(**dict(module_kwargs or {}))
        if getattr(self.module, "automatic_optimization", True) is False:
            raise ValueError(
                f"{type(self.module).__qualname__} uses manual optimization (automatic_optimization = False), "
                "which dagtune.LightningTrainer does not drive"
            )
        self.datamodule = self.make_datamodule(**dict(datamodule_kwargs or {}))
        self.module.to(self.device)
        self._logged = _Logged()
        self.module.log = self._logged_log  # the module logs to dagtune, not to a Trainer
        self.module.log_dict = self._logged_log_dict
        source = self.datamodule if self.datamodule is not None else self.module
        if self.datamodule is not None:
            self.datamodule.prepare_data()
            self.datamodule.setup("fit")
        train = source.train_dataloader()
        self._train_loader = train
        self._val_loaders = self._as_loaders(
            source.val_dataloader() if hasattr(source, "val_dataloader") else None
        )
        if getattr(train, "batch_size", None) is None:
            raise ValueError(
                "the training DataLoader must batch with batch_size (dagtune draws its batches; a "
                "batch_sampler of its own can't be resumed)"
            )
        self.batches = ResumableBatches(
            len(train.dataset),
            train.batch_size,
            seed=seed,
            shuffle=isinstance(train.sampler, torch.utils.data.RandomSampler),
            drop_last=train.drop_last,
        )
        self.optimizer, self.schedulers = self._optimizers(self.module.configure_optimizers())
        self.global_step = 0
        self.epoch = 0

    # ------------------------------------------------------------------ building

    def make_module(self, **kwargs: Any) -> Any:
        """The LightningModule (default: ``module_class(**module_kwargs)``)."""
        if self.module_class is None:
            raise TypeError(f"{type(self).__qualname__} must set module_class or override make_module")
        return self.module_class(**kwargs)

    def make_datamodule(self, **kwargs: Any) -> Any:
        """The LightningDataModule, or None to use the module's own dataloaders (default:
        ``datamodule_class(**datamodule_kwargs)`` if `datamodule_class` is set)."""
        if self.datamodule_class is None:
            if kwargs:
                raise TypeError(
                    f"datamodule_kwargs given but {type(self).__qualname__} has no datamodule_class"
                )
            return None
        return self.datamodule_class(**kwargs)

    @staticmethod
    def _as_loaders(loaders: Any) -> list[Any]:
        if loaders is None:
            return []
        if isinstance(loaders, (list, tuple)):
            return list(loaders)
        if isinstance(loaders, Mapping):
            return list(loaders.values())
        return [loaders]

    def _optimizers(self, configured: Any) -> tuple[torch.optim.Optimizer, list[dict]]:
        """The optimizer and the schedulers ``configure_optimizers`` returned, in any of the
        forms Lightning accepts with one optimizer."""
        owner = f"{type(self.module).__qualname__}.configure_optimizers()"
        optimizers: list[Any] = []
        schedulers: list[Any] = []
        if isinstance(configured, (Mapping, torch.optim.Optimizer)):
            configured = [configured]
        if (
            isinstance(configured, (list, tuple))
            and len(configured) == 2
            and all(isinstance(part, (list, tuple)) for part in configured)
        ):
            optimizers, schedulers = list(configured[0]), list(configured[1])
        elif isinstance(configured, (list, tuple)):
            for item in configured:
                if isinstance(item, Mapping):  # {"optimizer": ..., "lr_scheduler": ..., "monitor": ...}
                    optimizers.append(item.get("optimizer"))
                    scheduler = item.get("lr_scheduler")
                    if scheduler is not None:
                        entry = (
                            dict(scheduler) if isinstance(scheduler, Mapping) else {"scheduler": scheduler}
                        )
                        if item.get("monitor") is not None:
                            entry.setdefault("monitor", item["monitor"])
                        schedulers.append(entry)
                else:
                    optimizers.append(item)
        else:
            raise ValueError(f"{owner} returned {configured!r}: dagtune needs an optimizer")
        if len(optimizers) != 1 or not isinstance(optimizers[0], torch.optim.Optimizer):
            raise ValueError(f"{owner} returned {len(optimizers)} optimizers; dagtune drives exactly one")
        checked = []
        for scheduler in schedulers:
            entry = dict(scheduler) if isinstance(scheduler, Mapping) else {"scheduler": scheduler}
            entry.setdefault("interval", "epoch")
            entry.setdefault("frequency", 1)
            kind = type(entry["scheduler"]).__name__
            if entry.get("monitor") is not None or kind == "ReduceLROnPlateau":
                raise ValueError(f"{owner}: {kind} monitors a metric, which dagtune does not drive")
            if entry["interval"] not in ("epoch", "step"):
                raise ValueError(
                    f"{owner}: scheduler interval must be 'epoch' or 'step', got {entry['interval']!r}"
                )
            checked.append(entry)
        return optimizers[0], checked

    # ------------------------------------------------------------------ hyper-parameters

    def setup(self, hp: dict[str, Any]) -> None:
        self.apply_hyperparameters(hp)

    def apply_hyperparameters(self, hp: Mapping[str, Any]) -> None:
        """Apply hyper-parameter values (see the module docstring for the default rules).
        Override it for others, calling ``super().apply_hyperparameters(rest)`` for the rest;
        like `Trainer.setup`, applying a value again must change nothing."""
        groups = self.optimizer.param_groups
        hparams = getattr(self.module, "hparams", None)
        for name, value in hp.items():
            if name == "batch_size":
                self.batches.set_batch_size(value)
            elif any(name in group for group in groups):
                if name == "lr" and self.schedulers:
                    raise ValueError(
                        "lr is tuned by dagtune (a sequence is its schedule) and also scheduled by "
                        f"{type(self.module).__qualname__}.configure_optimizers(); drop one of them"
                    )
                for group in groups:
                    if name in group:
                        group[name] = value
            elif name in self.module_hparams:
                if isinstance(hparams, dict):
                    hparams[name] = value
                if self._plain_attribute(name):
                    setattr(self.module, name, value)
            else:
                known = sorted({k for g in groups for k in g if k != "params"})
                raise ValueError(
                    f"hyper-parameter {name!r} is not an optimizer setting ({', '.join(known)}), batch_size "
                    f"or one of {type(self).__qualname__}.module_hparams {list(self.module_hparams)} (values "
                    "the module reads while it trains); list it there, or override apply_hyperparameters"
                )

    def _plain_attribute(self, name: str) -> bool:
        """The module has `name` as a plain value (not a method, submodule or tensor)."""
        value = getattr(self.module, name, None)
        return (
            name in vars(self.module)
            and not callable(value)
            and not isinstance(value, (torch.nn.Module, torch.Tensor))
        )

    # ------------------------------------------------------------------ logging

    def _logged_log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        self._logged.log(name, value, **kwargs)

    def _logged_log_dict(self, dictionary: Mapping[str, Any], *args: Any, **kwargs: Any) -> None:
        self._logged.log_dict(dictionary, **kwargs)

    @contextmanager
    def _phase(self) -> Iterator[_Logged]:
        outer, self._logged = self._logged, _Logged()
        try:
            yield self._logged
        finally:
            self._logged = outer

    # ------------------------------------------------------------------ data

    def _fetch(self, loader: Any, indices: list[int]) -> Any:
        dataset = loader.dataset
        getitems = getattr(dataset, "__getitems__", None)
        items = getitems(indices) if getitems is not None else [dataset[i] for i in indices]
        return loader.collate_fn(items)

    def _to_device(self, batch: Any, loader: int) -> Any:
        module = self.module
        if hasattr(module, "on_before_batch_transfer"):
            batch = module.on_before_batch_transfer(batch, loader)
        if hasattr(module, "transfer_batch_to_device"):
            batch = module.transfer_batch_to_device(batch, self.device, loader)
        if hasattr(module, "on_after_batch_transfer"):
            batch = module.on_after_batch_transfer(batch, loader)
        return batch

    def _validation_batches(self, loader: Any) -> Iterable[Any]:
        if loader.batch_sampler is not None:
            for indices in loader.batch_sampler:
                yield self._fetch(loader, list(indices))
        else:  # no automatic batching: items one by one
            for index in loader.sampler:
                yield loader.collate_fn(loader.dataset[index]) if loader.collate_fn else loader.dataset[index]

    # ------------------------------------------------------------------ training

    def _hook(self, name: str, *args: Any) -> None:
        hook = getattr(self.module, name, None)
        if hook is not None:
            hook(*args)

    def train(self) -> dict[str, float]:
        module, optimizer = self.module, self.optimizer
        losses: list[tuple[float, int]] = []
        batches = (
            self.batches.epoch()
            if self.batches_per_step is None
            else self.batches.take(self.batches_per_step)
        )
        with self._phase() as logged:
            for batch_index, indices in enumerate(self._drawn(batches)):
                batch = self._to_device(self._fetch(self._train_loader, indices.tolist()), 0)
                logged.batch_size = _batch_size(batch) or len(indices)
                optimizer.zero_grad(set_to_none=True)
                output = module.training_step(batch, batch_index)
                loss = output["loss"] if isinstance(output, Mapping) else output
                if loss is None:  # Lightning: returning None skips the batch
                    continue
                self._hook("on_before_backward", loss)
                loss.backward()
                self._hook("on_after_backward")
                self._clip()
                self._hook("on_before_optimizer_step", optimizer)
                optimizer.step()
                self.global_step += 1
                for entry in self.schedulers:
                    if entry["interval"] == "step" and self.global_step % entry["frequency"] == 0:
                        entry["scheduler"].step()
                losses.append((float(loss.detach().item()), logged.batch_size))
            metrics = logged.result()
        if "loss" not in metrics and losses:
            metrics["loss"] = sum(v * w for v, w in losses) / sum(w for _, w in losses)
        return metrics

    def _drawn(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The step's batches, with the epoch hooks (and epoch schedulers) where the data
        order starts and ends an epoch."""
        while True:
            starting, epoch = self.batches.position == 0, self.batches.current_epoch
            try:
                indices = next(batches)
            except StopIteration:
                return
            if starting:
                self._hook("on_train_epoch_start")
            yield indices
            if self.batches.current_epoch != epoch:
                self._hook("on_train_epoch_end")
                self.epoch += 1
                for entry in self.schedulers:
                    if entry["interval"] == "epoch" and self.epoch % entry["frequency"] == 0:
                        entry["scheduler"].step()

    def _clip(self) -> None:
        if self.gradient_clip_val is None:
            return
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.gradient_clip_algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(parameters, self.gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(parameters, self.gradient_clip_val)

    def evaluate(self) -> dict[str, float]:
        module = self.module
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        try:
            with torch.no_grad(), self._phase() as logged:
                self._hook("on_validation_epoch_start")
                several = len(self._val_loaders) > 1
                for loader_index, loader in enumerate(self._val_loaders):
                    logged.suffix = f"/dataloader_idx_{loader_index}" if several else ""
                    for batch_index, raw in enumerate(self._validation_batches(loader)):
                        batch = self._to_device(raw, loader_index)
                        logged.batch_size = _batch_size(batch) or 1
                        module.validation_step(batch, batch_index, *([loader_index] if several else []))
                logged.suffix = ""
                self._hook("on_validation_epoch_end")
                return logged.result()
        finally:
            for submodule, training in modes:
                submodule.train(training)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        self._hook("on_save_checkpoint", extra)
        return {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "schedulers": [entry["scheduler"].state_dict() for entry in self.schedulers],
            "data": self.batches.state_dict(),
            "datamodule": self.datamodule.state_dict() if self.datamodule is not None else {},
            "counters": {"global_step": self.global_step, "epoch": self.epoch},
            "extra": extra,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        for entry, saved in zip(self.schedulers, state["schedulers"], strict=True):
            entry["scheduler"].load_state_dict(saved)
        self.batches.load_state_dict(state["data"])
        if self.datamodule is not None and state["datamodule"]:
            self.datamodule.load_state_dict(state["datamodule"])
        self.global_step = int(state["counters"]["global_step"])
        self.epoch = int(state["counters"]["epoch"])
        self._hook("on_load_checkpoint", dict(state["extra"]))
