"""The user's side of dagtune: the `Trainer` contract, RNG capture and resumable data order.

dagtune trains a shared prefix once and lets every trial branch from its checkpoint, so a
trial that resumes from a checkpoint must compute exactly what an uninterrupted run would
have computed. That holds when three things survive a checkpoint bit for bit: the trainer's
own state (model, optimizer, data position: `Trainer.state_dict`), the global random number
generators of python, numpy and torch (`capture_rng` / `restore_rng`, saved with every
checkpoint), and the order in which data is drawn (`ResumableBatches`, whose permutation of
every epoch is a pure function of ``(seed, epoch)`` and whose position is part of the state,
so it also survives a change of batch size, Hippo §5.1).
"""

from __future__ import annotations

import inspect
import random
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from dagtune.errors import TrainerCheckError
from dagtune.validation import check_int

__all__ = [
    "DaemonicWorkerError",
    "ResumableBatchSampler",
    "ResumableBatches",
    "Trainer",
    "build_trainer",
    "capture_rng",
    "check_rng_state",
    "check_torch_threads",
    "explained",
    "isolated_rng",
    "kept_training_modes",
    "modules_of",
    "restore_rng",
    "seed_everything",
    "torch_threads",
]

_MAX_SEED = 2**64


# --------------------------------------------------------------------------- the contract


class Trainer(ABC):
    """What a user implements to tune a model with dagtune.

    The subclass's ``__init__(**trainer_kwargs)`` runs on the Dask worker that trains a stage:
    it loads the data and builds the model and the optimizer. Before it runs, dagtune seeds
    python, numpy and torch from the study seed (`seed_everything`), and passes ``seed=`` when
    ``__init__`` has a parameter named ``seed``; everything random in ``__init__`` must come
    from those sources so that every worker builds the same initial trainer.

    A stage then calls ``setup``/``train`` once per step, ``evaluate`` where metrics are
    needed, and ``state_dict`` at its end; a stage that resumes from a checkpoint builds a
    fresh trainer, calls ``load_state_dict`` and restores the RNG state saved with it. For a
    resumed run to be bit-for-bit the run it shares a prefix with, the rules below must hold.
    """

    @abstractmethod
    def setup(self, hp: dict[str, Any]) -> None:
        """Apply hyper-parameter values before a step.

        dagtune calls it with the full values (every hyper-parameter of the config) when a
        stage starts or resumes, and with only the values that changed before any later step
        where something changed. So applying a value must be idempotent: setting an unchanged
        value again (e.g. the batch size of a resumed data order) must not change anything,
        and applying a value must not depend on how many times it was applied before. Values
        are JSON scalars exactly as the sequences give them (``128`` is an int).
        """

    @abstractmethod
    def train(self) -> dict[str, float] | None:
        """Train one step (what a step is, an epoch or k batches, is the user's choice).

        May return training metrics (plain Python floats, e.g. ``{"loss": 0.31}``); they are
        reported with the step's validation metrics.
        """

    @abstractmethod
    def evaluate(self) -> dict[str, float]:
        """Validation metrics of the current model, as plain Python floats (``{"val_acc": 0.93}``).

        Must not change what `state_dict` holds: no optimizer step, no batch-norm statistics
        updated, data position untouched. dagtune puts back the rest itself: it calls
        ``evaluate`` inside `isolated_rng` (random draws while evaluating do not shift the
        training run's random numbers) and `kept_training_modes` (a ``model.eval()`` here
        needs no ``model.train()`` after it, as in PyTorch's examples).
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume training bit for bit: model, optimizer, schedulers,
        data position (`ResumableBatches.state_dict`), any counters.

        It may contain only tensors, numbers, strings, bools, None and lists, tuples and dicts
        of those: dagtune saves it with ``torch.save`` and loads it with
        ``torch.load(weights_only=True)``, which refuses any other Python object. The global
        RNG states are saved by dagtune; a private ``torch.Generator`` must be saved here.
        Each worker checks at its first checkpoint of a model that a trainer loaded from it
        trains the next step exactly as this one does (`dagtune.resumecheck`).
        """

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, into a freshly built trainer."""


def build_trainer(cls: type[Trainer], kwargs: Mapping[str, Any] | None, seed: int) -> Trainer:
    """Seed python, numpy and torch with `seed`, then construct ``cls(**kwargs)``.

    ``seed=seed`` is passed too when ``cls.__init__`` has a parameter named ``seed`` and
    `kwargs` does not set it already.
    """
    if not (isinstance(cls, type) and issubclass(cls, Trainer)):
        name = getattr(cls, "__qualname__", None) or repr(cls)
        raise TypeError(f"{name} is not a dagtune.Trainer subclass; derive it from dagtune.Trainer")
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(f"trainer_kwargs for {cls.__qualname__} must be a dict, got {kwargs!r}")
    kwargs = dict(kwargs)
    if "seed" not in kwargs and _accepts_seed(cls):
        kwargs["seed"] = seed
    seed_everything(seed)
    return cls(**kwargs)


#: trainer class -> whether its constructor takes ``seed``: `inspect.signature` costs 0.1 to
#: 0.3 ms, and every task builds a trainer. Keyed by the class object, held weakly: a class
#: redefined in a notebook is a new object, looked at anew, and the old one may be collected.
_ACCEPTS_SEED: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _accepts_seed(cls: type) -> bool:
    """Whether ``cls(...)`` takes a parameter named ``seed`` (by keyword); looked up once per class."""
    accepts = _ACCEPTS_SEED.get(cls)
    if accepts is None:
        accepts = _ACCEPTS_SEED[cls] = _signature_takes_seed(cls)
    return accepts


def _signature_takes_seed(cls: type) -> bool:
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # no introspectable signature
        return False
    parameter = parameters.get("seed")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


# --------------------------------------------------------------------------- global RNGs


def _check_seed(seed: Any, owner: str = "seed") -> int:
    if isinstance(seed, np.integer):
        seed = int(seed)
    return check_int(owner, seed, minimum=0, maximum=_MAX_SEED - 1, expected="an int in [0, 2**64)")


def seed_everything(seed: int) -> None:
    """Seed python's `random`, numpy's global RNG and torch (CPU and every CUDA device)."""
    seed = _check_seed(seed)
    random.seed(seed)
    # numpy's legacy seeding takes 32-bit words; a larger seed is given as two of them
    np.random.seed(seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32])
    if torch.accelerator.current_accelerator() is None:
        # what torch.manual_seed does on a machine without accelerators, less the lazy
        # seeding of absent devices (CUDA, XPU, MTIA: each formats the caller's stack,
        # about 1.3 ms per call, more than the rest of a worker's trainer set-up)
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)  # also seeds every accelerator (lazily if not initialized)


def capture_rng() -> dict[str, Any]:
    """The states of python's, numpy's global and torch's (CPU and CUDA) random generators.

    The result holds only tensors, ints, floats, None, lists and dicts, so it round-trips
    through ``torch.save`` and ``torch.load(weights_only=True)``; `restore_rng` takes it back.
    """
    version, internal, gauss_next = random.getstate()
    kind, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss_next},
        "numpy": {
            "kind": str(kind),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Put back the generator states `capture_rng` returned (possibly after a save and load).

    Each part present is restored. CUDA states are restored to as many devices as both the
    state and this process have, and ignored where CUDA is not available.
    """
    if "python" in state:
        random.setstate(_python_state(state["python"]))
    if "numpy" in state:
        np.random.set_state(_numpy_state(state["numpy"]))
    if "torch" in state:
        torch.set_rng_state(_byte_tensor(state["torch"]))
    if state.get("cuda") and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(_byte_tensor(cuda_state), device)


def check_rng_state(state: Any) -> None:
    """Raise a ValueError unless `state` holds what `capture_rng` returns (python's, numpy's
    and torch's states, and CUDA's if present): each part is restored into a throwaway
    generator, which checks it exactly as `restore_rng` would, and nothing global changes."""
    if not isinstance(state, Mapping) or not {"python", "numpy", "torch"} <= state.keys():
        found = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"an RNG state needs 'python', 'numpy' and 'torch', got {found}")
    try:
        random.Random().setstate(_python_state(state["python"]))
        np.random.RandomState().set_state(_numpy_state(state["numpy"]))
        for part in [state["torch"], *(state.get("cuda") or ())]:
            torch.Generator().set_state(_byte_tensor(part))
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as error:
        raise ValueError(f"not an RNG state captured by dagtune: {type(error).__name__}: {error}") from None


def _python_state(py: Mapping[str, Any]) -> tuple:
    words = py["state"]
    # a checkpoint stores the 625 words as one tensor (`dagtune.runner.stored_state`):
    # `tolist` reads them at once, where iterating would make a tensor per word
    words = words.tolist() if isinstance(words, torch.Tensor) else words
    return int(py["version"]), tuple(int(v) for v in words), py["gauss_next"]


def _numpy_state(npy: Mapping[str, Any]) -> tuple:
    key = np.asarray(npy["key"], dtype=np.int64).astype(np.uint32)
    return npy["kind"], key, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])


def _byte_tensor(value: Any) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.uint8, device="cpu")


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a block without it affecting the global random generators: the states captured on
    entry are restored on exit, also when the block raises. dagtune wraps `Trainer.evaluate`
    in it, so evaluating or not evaluating at a step gives the same training run.

    It keeps the generators' native state objects (no conversion to a storable form), so it
    costs microseconds: it runs at every evaluated step.
    """
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# --------------------------------------------------------------------------- modes and threads


def modules_of(trainer: Trainer) -> list[torch.nn.Module]:
    """Every torch module `trainer` holds in an attribute, directly or in a list, tuple or
    dict attribute (``self.model``, ``self.nets = [...]``), each once, in attribute order."""
    found: dict[int, torch.nn.Module] = {}
    for value in getattr(trainer, "__dict__", {}).values():
        items = (
            value.values()
            if isinstance(value, dict)
            else value
            if isinstance(value, (list, tuple))
            else [value]
        )
        for item in items:
            if isinstance(item, torch.nn.Module):
                found.setdefault(id(item), item)
    return list(found.values())


@contextmanager
def kept_training_modes(trainer: Trainer) -> Iterator[None]:
    """Run a block, then put every module of `trainer` (`modules_of`, with all their
    submodules) back in the training mode each had on entry, also when the block raises.

    dagtune wraps `Trainer.evaluate` in it, as it wraps it in `isolated_rng`: PyTorch's own
    examples call ``model.eval()`` when they evaluate and ``model.train()`` only at the
    start of training, and such an ``evaluate`` must not leave a resumed or continued
    trainer in another mode than one that never evaluated. Each flag is set back as it was
    (``module.training``), not through ``train()``, which a module may override.
    """
    modes = [(module, module.training) for top in modules_of(trainer) for module in top.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run a block with torch's intra-op thread count set to `count` (None: as it is), then
    set it back to what it was.

    CPU kernels split their reductions by thread count, so the same step run with another
    count may round differently (1e-8 apart): every worker and `run_alone` train with one
    count so that results are bit for bit the same wherever a step runs.
    """
    if count is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_torch_threads(value: Any) -> int | None:
    """`torch_threads` as `Study` and `run_alone` take it: a positive int or None, else a ValueError."""
    return check_int("torch_threads", value, minimum=1, optional=True, note="leave torch's as it is")


# --------------------------------------------------------------------------- data order


def _positive_int(owner: str, value: Any) -> int:
    if isinstance(value, np.integer):
        value = int(value)
    return check_int(owner, value, minimum=1)


class ResumableBatches:
    """The order in which a training loop draws batches of sample indices: resumable from its
    state at any point and able to change batch size in the middle of an epoch (Hippo §5.1).

    Epoch ``e`` visits the ``n`` samples in the permutation drawn by its own generator,
    ``np.random.default_rng([seed, e])`` (``0, 1, ..., n - 1`` without `shuffle`); no global
    RNG is read or advanced. The state is the epoch, the position (samples of the epoch drawn
    so far) and the batch size, so a trainer rebuilt from `state_dict` draws exactly the
    batches the uninterrupted one would have, and after `set_batch_size` the next batch
    starts at the very next sample of the permutation.

    Batches are numpy int64 arrays of indices into the dataset (index a tensor with
    ``data[torch.from_numpy(batch)]``); `sampler` gives lists of ints for a ``DataLoader``.
    The last batch of an epoch holds the remaining samples, or is skipped with `drop_last`.
    The state advances as batches are drawn, and the epoch rolls over as soon as its last
    batch is drawn, so a trainer whose step is one epoch ends every step at ``position 0``.

    Usage, one step = one epoch::

        for idx in self.batches.epoch(): ...

    or one step = k batches (crossing epoch boundaries)::

        for idx in self.batches.take(k): ...
    """

    def __init__(self, n: int, batch_size: int, seed: int, *, shuffle: bool = True, drop_last: bool = False):
        self._n = _positive_int("ResumableBatches.n", n)
        self._seed = _check_seed(seed, "ResumableBatches.seed")
        self._shuffle = bool(shuffle)
        self._drop_last = bool(drop_last)
        self._batch_size = self._checked_batch_size(batch_size)
        self._epoch = 0
        self._position = 0
        self._cache: tuple[int, np.ndarray] | None = None

    # ---- what it is

    @property
    def n(self) -> int:
        return self._n

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def shuffle(self) -> bool:
        return self._shuffle

    @property
    def drop_last(self) -> bool:
        return self._drop_last

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def current_epoch(self) -> int:
        """The epoch the next batch comes from (counting from 0)."""
        return self._epoch

    @property
    def position(self) -> int:
        """Samples of the current epoch drawn so far."""
        return self._position

    def __repr__(self) -> str:
        return (
            f"ResumableBatches(n={self._n}, batch_size={self._batch_size}, seed={self._seed}, "
            f"shuffle={self._shuffle}, drop_last={self._drop_last}, "
            f"epoch={self._epoch}, position={self._position})"
        )

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the samples in `epoch` (a read-only int64 array)."""
        if self._cache is None or self._cache[0] != epoch:
            if self._shuffle:
                order = np.random.default_rng([self._seed, epoch]).permutation(self._n)
            else:
                order = np.arange(self._n)
            order = order.astype(np.int64, copy=False)
            order.flags.writeable = False
            self._cache = (epoch, order)
        return self._cache[1]

    # ---- drawing

    def _has_batch(self) -> bool:
        """Whether the current epoch still holds a batch to draw."""
        remaining = self._n - self._position
        return remaining >= self._batch_size if self._drop_last else remaining > 0

    def _roll(self) -> None:
        if not self._has_batch():
            self._epoch += 1
            self._position = 0

    def next_batch(self) -> np.ndarray:
        """Draw the next batch (rolling over to the next epoch where this one ends)."""
        self._roll()
        start = self._position
        batch = self.permutation(self._epoch)[start : start + self._batch_size].copy()
        self._position = start + len(batch)
        self._roll()
        return batch

    def epoch(self) -> Iterator[np.ndarray]:
        """The remaining batches of the current epoch (all of them at ``position 0``); the
        state advances as they are drawn and rolls over to the next epoch after the last one."""
        return self._epoch_batches()

    def _epoch_batches(self) -> Iterator[np.ndarray]:
        self._roll()
        current = self._epoch
        while self._epoch == current:
            yield self.next_batch()

    def take(self, k: int) -> Iterator[np.ndarray]:
        """The next `k` batches, crossing epoch boundaries; the state advances as they are drawn."""
        if isinstance(k, np.integer):
            k = int(k)
        check_int("take()'s k", k, minimum=0)
        return (self.next_batch() for _ in range(k))

    def batches_left(self) -> int:
        """How many batches `epoch` would yield now."""
        remaining = self._n - self._position if self._has_batch() else self._n
        if self._drop_last:
            return remaining // self._batch_size
        return -(-remaining // self._batch_size)

    def sampler(self, batches: int | None = None) -> ResumableBatchSampler:
        """A ``batch_sampler`` for ``torch.utils.data.DataLoader`` drawing from this order: each
        pass over the loader yields the rest of the current epoch, or the next `batches`."""
        return ResumableBatchSampler(self, batches)

    # ---- changing and saving

    def _checked_batch_size(self, batch_size: Any) -> int:
        batch_size = _positive_int("batch_size", batch_size)
        if self._drop_last and batch_size > self._n:
            raise ValueError(
                f"batch_size {batch_size} is larger than the {self._n} samples: "
                "with drop_last no batch could ever be drawn"
            )
        return batch_size

    def set_batch_size(self, batch_size: int) -> None:
        """Draw batches of `batch_size` from now on, continuing at the same sample of the same
        epoch; setting the current size again changes nothing."""
        self._batch_size = self._checked_batch_size(batch_size)

    def state_dict(self) -> dict[str, Any]:
        """Position, batch size and identity (n, seed, shuffle, drop_last), as plain values."""
        return {
            "epoch": self._epoch,
            "position": self._position,
            "batch_size": self._batch_size,
            "n": self._n,
            "seed": self._seed,
            "shuffle": self._shuffle,
            "drop_last": self._drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict`. The order must be the same one (n, seed, shuffle and
        drop_last equal), since a different one would silently change the training run."""
        mine = self.state_dict()
        differ = [
            f"{name} {state[name]!r} != {mine[name]!r}"
            for name in ("n", "seed", "shuffle", "drop_last")
            if name in state and state[name] != mine[name]
        ]
        if differ:
            raise ValueError(f"the saved data order is a different one: {', '.join(differ)}")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self._n:
            raise ValueError(f"bad data order state: epoch {epoch}, position {position} of {self._n}")
        batch_size = self._checked_batch_size(int(state["batch_size"]))
        self._epoch, self._position, self._batch_size = epoch, position, batch_size


class ResumableBatchSampler(Sampler[list[int]]):
    """A ``DataLoader`` batch sampler over a `ResumableBatches`, sharing its state.

    ``DataLoader(dataset, batch_sampler=batches.sampler())``: every pass over the loader
    yields the rest of the current epoch, as lists of ints; with ``batches.sampler(k)`` every
    pass yields the next `k` batches. The shared `ResumableBatches` advances as the loader
    draws indices, which it does ahead of the training loop when it prefetches with worker
    processes, so save the state at the end of a pass (a step), not in the middle of one.
    """

    def __init__(self, batches: ResumableBatches, num_batches: int | None = None):
        super().__init__()
        if num_batches is not None:
            num_batches = _positive_int("num_batches", num_batches)
        self.batches = batches
        self.num_batches = num_batches

    def __iter__(self) -> Iterator[list[int]]:
        source = self.batches.epoch() if self.num_batches is None else self.batches.take(self.num_batches)
        for batch in source:
            yield batch.tolist()

    def __len__(self) -> int:
        return self.batches.batches_left() if self.num_batches is None else self.num_batches


class DaemonicWorkerError(TrainerCheckError, RuntimeError):
    """The trainer started processes (a ``DataLoader`` with ``num_workers > 0``, a process
    pool) in a Dask worker process, which is daemonic and may not have children."""


_DAEMONIC = "daemonic processes are not allowed to have children"


def explained(error: BaseException) -> BaseException:
    """`error`, or for an error whose fix dagtune knows, an error that names it (caused by
    `error`, whose traceback it keeps): a ``DataLoader(num_workers=2)`` in a Dask worker
    fails deep in multiprocessing with ``AssertionError: daemonic processes are not allowed
    to have children``, while ``run_alone`` in the user's own process runs it."""
    if not (isinstance(error, AssertionError) and _DAEMONIC in str(error)):
        return error
    clearer = DaemonicWorkerError(
        "the trainer starts processes (a DataLoader with num_workers > 0, a multiprocessing pool), "
        "and Dask's worker processes are daemonic, which may not have children (AssertionError: "
        f"{_DAEMONIC}). Load batches in the worker's own process (DataLoader(..., num_workers=0); "
        "data in memory rarely gains from more), or start the workers non-daemonic: "
        "dask.config.set({'distributed.worker.daemon': False}) before the Study starts its local "
        "cluster, or DASK_DISTRIBUTED__WORKER__DAEMON=False in the environment of `dagtune run` "
        "and of `dask worker`. The stage is not retried: it would fail the same way."
    )
    clearer.__cause__ = error
    return clearer
