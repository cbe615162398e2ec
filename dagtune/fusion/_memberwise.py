"""Operations a fused group computes one member at a time, so no member depends on its group.

Under ``vmap`` an operation of K members runs as one operation on the stacked tensors, and
for some the result of a member then depends on K or on the layout vmap gives the stack:

- **convolutions** become one grouped convolution with K times the channels, and a
  matrix-vector product (a linear layer with one input or output feature) a batched
  product; the CPU kernels pick their algorithm, blocking and summation order from the
  combined shape, so a member's gradients round differently with K (measured: a 1-4-8
  channel CNN, 1e-8 after one batch at K = 2 against K = 1);
- **normalizations** (`batch_norm`, `instance_norm`, `group_norm`, `layer_norm`,
  `rms_norm`) fold the members into the channels and apply each member's affine weight as
  a separate product: reductions of another shape and another rounding of the affine part,
  so a member's running statistics and gradients depend on K (measured: BatchNorm2d after a
  max pooling, or on the shared input, 3e-8 to 1e-7 after one batch);
- **matrix products** (``@``, ``bmm``, ``einsum``, attention) with a transposed or shared
  operand are blocked differently as K changes (``a @ b.T`` with `b` shared, ``mv``: 1e-6;
  attention with dropout, whose math path runs batched ``bmm``: 3e-6 in gradients);
- **recurrent layers** (`nn.GRU`, `nn.LSTM`, `nn.RNN`) have no batching rule at all;
- **dropout** under ``randomness="same"`` draws one mask of the member's shape in logical
  (row-major) order, where unfused dropout draws its noise into a tensor laid out like its
  input: on a non-contiguous activation (``nn.MultiheadAttention(batch_first=True)``'s
  output) the same random numbers land on other elements.

Computed member by member, each member's operation is exactly the call an unfused trainer
makes on its own tensors, so its result depends on nothing but its own weights, whatever K.
`MemberwiseLayers` is a torch function mode that routes those operations to `memberwise`,
which unwraps vmap's batched tensors, calls the operation once per member one level below
vmap (ordinary differentiable operations that autograd records as it would for an unfused
trainer; in-place updates of running statistics land in each member's slice of the stacked
buffer) and batches the stacked results again: what torch's ``autograd.Function`` vmap
support does, at a tenth of its per-call overhead. Random operations are replayed: every
member's call starts from the same generator state, so each draws the numbers it would draw
alone and the generator ends where one unfused call leaves it. Multiplicative dropout
(`shared_noise`) draws its noise once, into a tensor laid out like a member's slice of the
input, and multiplies every member by it (the same products, one draw).

Max pooling (``max_pool2d``, `channels_last_pool`), exact whatever its layout, runs in the
channels-last layout, one call for every member: the same values, indices and gradients bit
for bit as the unfused NCHW kernel (tested, ties included), which on this CPU is 8x slower
than the channels-last one (0.35 ms against 0.04 ms for a 64x16x8x8 batch).

With ``kernels="grouped"`` (`FusibleTrainer.fused_kernels`) convolutions and matrix products
keep vmap's batching rules instead: one grouped convolution for all members (as HFTA and
Hydro fuse them) and one batched product, much faster for small CNNs, but a member's result
then depends on K by rounding (docs/fusion.md states what holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._C._functorch import TransformType, _add_batch_dim, _unwrap_batched
from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
from torch.nn import functional
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

__all__ = [
    "AFFINE_DROPOUTS",
    "CONVOLUTIONS",
    "KERNEL_MODES",
    "MATRIX_PRODUCTS",
    "MAX_POOLS",
    "MEMBERWISE_OPERATIONS",
    "MULTIPLICATIVE_DROPOUTS",
    "NORMALIZATIONS",
    "RANDOM_OPERATIONS",
    "RECURRENT",
    "ROW_LOSSES",
    "MemberwiseLayers",
    "below_vmap",
    "channels_last",
    "channels_last_pool",
    "memberwise",
    "row_loss",
    "shared_noise",
    "stack_in_layout",
]

#: how a fused group computes convolutions and matrix products: one member at a time
#: (K-independent, bitwise the unfused call) or batched, a grouped convolution (fast, a
#: member's result depends on K within rounding)
KERNEL_MODES = ("exact", "grouped")

CONVOLUTIONS = frozenset(
    {
        torch.conv1d,
        torch.conv2d,
        torch.conv3d,
        torch.conv_transpose1d,
        torch.conv_transpose2d,
        torch.conv_transpose3d,
    }
)
NORMALIZATIONS = frozenset(
    {
        functional.batch_norm,
        functional.instance_norm,
        functional.group_norm,
        functional.layer_norm,
        functional.rms_norm,
    }
)
#: products of matrices (and attention): batched, their CPU kernels pick another blocking for a
#: transposed or shared operand as K changes (measured: ``a @ b.T`` with `b` shared, ``mv``)
MATRIX_PRODUCTS = frozenset(
    {
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.mv,
        torch.addmm,
        torch.baddbmm,
        torch.addbmm,
        torch.addmv,
        torch.einsum,
        torch.Tensor.matmul,
        torch.Tensor.mm,
        torch.Tensor.bmm,
        torch.Tensor.mv,
        torch.Tensor.addmm,
        torch.Tensor.baddbmm,
        torch.Tensor.__matmul__,
        torch.Tensor.__rmatmul__,
        functional.scaled_dot_product_attention,
        functional.multi_head_attention_forward,  # torch functions inside a handled one pass unseen
    }
)
#: the recurrent kernels `nn.RNN`, `nn.GRU` and `nn.LSTM` call (``torch._VF.gru is torch.gru``)
RECURRENT = frozenset({torch.gru, torch.lstm, torch.rnn_tanh, torch.rnn_relu})
#: dropout that multiplies its input by noise: drawn once, laid out like a member's input
MULTIPLICATIVE_DROPOUTS = frozenset(
    {
        functional.dropout,
        functional.dropout1d,
        functional.dropout2d,
        functional.dropout3d,
        torch.dropout,
        torch.feature_dropout,
    }
)
#: dropout that also shifts its input: replayed member by member
AFFINE_DROPOUTS = frozenset(
    {
        functional.alpha_dropout,
        functional.feature_alpha_dropout,
        torch.alpha_dropout,
        torch.feature_alpha_dropout,
    }
)
#: losses whose ``reduction="none"`` result is one value per sample, a function of that
#: sample's row alone: the members' rows run as one call of K times the batch (`row_loss`)
ROW_LOSSES = frozenset({functional.cross_entropy, functional.nll_loss})
#: their arguments in order (``nll_loss`` has all but the last)
_LOSS_ARGUMENTS = (
    "input",
    "target",
    "weight",
    "size_average",
    "ignore_index",
    "reduce",
    "reduction",
    "label_smoothing",
)
#: computed in the channels-last layout, for every member at once
MAX_POOLS = frozenset({functional.max_pool2d, functional.max_pool2d_with_indices})
#: computed one member at a time (with ``kernels="exact"``; "grouped" batches the first two)
MEMBERWISE_OPERATIONS = CONVOLUTIONS | MATRIX_PRODUCTS | NORMALIZATIONS | RECURRENT
#: random: every member's call replays the generator (dropout inside attention, between
#: recurrent layers)
RANDOM_OPERATIONS = (
    RECURRENT
    | AFFINE_DROPOUTS
    | {functional.scaled_dot_product_attention, functional.multi_head_attention_forward}
)


class _Call:
    """An operation's call with its tensors taken out: the tensors are what vmap batches, the
    rest (`spec`) is rebuilt around each member's slices. Arguments with tensors only at the
    top level (the usual case: a convolution's ``stride=(1, 1)`` holds none) skip pytree,
    which costs more than the operations being fused."""

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict):
        self.function = function
        if not any(_holds_tensor(arg) for arg in (*args, *kwargs.values())):
            self.spec = None
            leaves = [*args, *kwargs.values()]
            self.names = list(kwargs)
        else:
            leaves, self.spec = pytree.tree_flatten((args, kwargs))
        self.leaves = leaves
        self.tensor_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def tensors(self) -> list[torch.Tensor]:
        return [self.leaves[i] for i in self.tensor_at]

    def __call__(self, tensors: Sequence[Any]) -> Any:
        leaves = list(self.leaves)
        for i, tensor in zip(self.tensor_at, tensors):
            leaves[i] = tensor
        if self.spec is None:
            positional = len(leaves) - len(self.names)
            return self.function(*leaves[:positional], **dict(zip(self.names, leaves[positional:])))
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.function(*args, **kwargs)


def _holds_tensor(value: Any) -> bool:
    """Whether `value` is a container (list, tuple, dict) with a tensor somewhere inside: only
    those need pytree; a convolution's ``stride=(1, 1)`` is a plain argument."""
    if isinstance(value, dict):
        value = list(value.values())
    if not isinstance(value, (list, tuple)):
        return False
    return any(isinstance(item, torch.Tensor) or _holds_tensor(item) for item in value)


def _flat(output: Any) -> tuple[list[Any], Any]:
    """`output`'s leaves and structure (a tensor alone: no pytree)."""
    if isinstance(output, torch.Tensor):
        return [output], None
    return pytree.tree_flatten(output)


def _unflat(leaves: list[Any], spec: Any) -> Any:
    return leaves[0] if spec is None else pytree.tree_unflatten(leaves, spec)


def below_vmap(
    rule: Callable[[int, list[torch.Tensor], list[int | None]], tuple[Any, Any]], tensors: list[Any]
):
    """Run `rule` on the unbatched tensors below the current vmap level and batch its result
    again: ``rule(members, values, dims)`` gets each tensor with the dimension holding its
    members (None: not batched) and returns ``(outputs, out_dims)`` (flat lists). What
    torch's own ``autograd.Function`` vmap support does, without its per-call pytree and
    signature work (10x the overhead). Returns None when nothing is batched at this level."""
    interpreter = retrieve_current_functorch_interpreter()
    if interpreter is None or interpreter.key() != TransformType.Vmap:
        return None
    level = interpreter.level()
    unwrapped = [_unwrap_batched(t, level) if isinstance(t, torch.Tensor) else (t, None) for t in tensors]
    values = [value for value, _ in unwrapped]
    dims = [dim for _, dim in unwrapped]
    if all(dim is None for dim in dims):
        return None
    with interpreter.lower():
        outputs, out_dims = rule(interpreter.batch_size(), values, dims)
    return [out if dim is None else _add_batch_dim(out, dim, level) for out, dim in zip(outputs, out_dims)]


def _members(value: torch.Tensor, dim: int | None, count: int) -> list[torch.Tensor]:
    """`value`'s slice of each member (None: not batched, the same for every member).
    ``unbind`` rather than one ``select`` per member: autograd then stacks the members'
    gradients once instead of adding K full-size ones."""
    if dim is None:
        return [value] * count
    return list(value.unbind(dim))


class _Replay:
    """The random generator of `device`, saved once and restored before each member's call."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.state = torch.cuda.get_rng_state(device) if self.cuda else torch.get_rng_state()

    def restore(self) -> None:
        if self.cuda:
            torch.cuda.set_rng_state(self.state, self.device)
        else:
            torch.set_rng_state(self.state)


def memberwise(function: Callable[..., Any], args: tuple, kwargs: dict, *, random: bool) -> Any:
    """``function(*args, **kwargs)`` under vmap, once per member on its slices of the batched
    tensors (replaying the random generator for a random operation); the members' outputs
    stacked, each member's slice laid out as its own output (`stack_in_layout`)."""
    call = _Call(function, args, kwargs)
    structure: list[Any] = []
    # one tensor passed several times (self-attention's query, key and value) is one tensor
    # for each member too: operations test identity (``query is key`` picks attention's
    # packed in-projection, one product instead of three, which rounds its gradients
    # differently)
    unique: dict[int, int] = {}
    positions = [unique.setdefault(id(tensor), len(unique)) for tensor in call.tensors()]
    distinct = list({id(tensor): tensor for tensor in call.tensors()}.values())

    def rule(members: int, values: list[torch.Tensor], dims: list[int | None]) -> tuple[list, list]:
        slices = [_members(value, dim, members) for value, dim in zip(values, dims)]
        per_member = zip(*(slices[i] for i in positions))
        replay = _Replay(values[0].device) if random else None
        outputs = []
        for member_tensors in per_member:
            if replay is not None:
                replay.restore()
            leaves, spec = _flat(call(member_tensors))
            structure[:] = [leaves, spec]
            outputs.append([leaf for leaf in leaves if isinstance(leaf, torch.Tensor)])
        stacked = [stack_in_layout(parts) for parts in zip(*outputs)]
        return stacked, [0] * len(stacked)

    batched = below_vmap(rule, distinct)
    if batched is None:  # nothing batched: the unfused call
        return function(*args, **kwargs)
    leaves, spec = structure
    given = iter(batched)
    return _unflat([next(given) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


def stack_in_layout(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The members' outputs `parts` stacked ``[K, ...]``, each member's slice with the strides
    of its own output: an operation that returns a transposed view (``nn.LSTM`` and ``nn.GRU``
    with ``batch_first=True``) gives a stack whose slices are transposed views too, so what
    depends on the layout downstream (dropout draws its noise laid out like its input) sees
    the unfused layout. ``torch.stack`` would make every slice contiguous: dropout on a
    batch-first LSTM's output then dropped other elements than unfused training drops
    (4e-3 in weights after 2 epochs). Outputs that are contiguous, not dense, or laid out
    differently from each other are stacked as they are."""
    first = parts[0]
    if first.dim() < 2 or first.is_contiguous() or any(part.stride() != first.stride() for part in parts):
        return torch.stack(list(parts))
    order = sorted(range(first.dim()), key=lambda d: -first.stride(d))  # outermost first
    if not first.permute(order).is_contiguous():  # overlapping or with gaps: no layout to keep
        return torch.stack(list(parts))
    stacked = torch.stack([part.permute(order) for part in parts])
    inverse = sorted(range(first.dim()), key=order.__getitem__)
    return stacked.permute(0, *(1 + d for d in inverse))


def row_loss(function: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """A per-sample loss (`ROW_LOSSES` with ``reduction="none"``) of every member in one call:
    each member's rows (its samples) stacked into one batch of K times the samples, a shared
    target repeated for each, the result split again. A sample's loss is computed from its own
    row (log-softmax over its classes, the target's entry), so each member gets the values of
    its own call whatever K (tested against K = 1 and unfused calls, several shapes); vmap's
    own rule decomposes the loss into a dozen batched operations: forward and backward cost
    1.4 to 2.3 times this one call (K = 32 to 1, a batch of 64 x 10 classes). A
    member-specific class weight, or one sample per member, runs one call per member; any
    other reduction keeps vmap's rule."""
    bound = {**dict(zip(_LOSS_ARGUMENTS, args)), **kwargs}
    names = [name for name in ("input", "target", "weight") if isinstance(bound.get(name), torch.Tensor)]
    if bound.get("reduction", "mean") != "none" or names[:2] != ["input", "target"]:
        return function(*args, **kwargs)
    rest = {name: value for name, value in bound.items() if name not in names}

    def rule(members: int, values: list[torch.Tensor], dims: list[int | None]) -> tuple[list, list]:
        given = dict(zip(names, zip(values, dims)))
        input, dim = given["input"]
        if dim is None or input.dim() < 3 or given.get("weight", (None, None))[1] is not None:
            each = zip(*(_members(value, d, members) for value, d in given.values()))
            parts = [function(**dict(zip(given, tensors)), **rest) for tensors in each]
            return [torch.stack(parts)], [0]
        target, target_dim = given["target"]
        stacked = (
            target.movedim(target_dim, 0) if target_dim is not None else target.expand(members, *target.shape)
        )
        tensors = {name: value for name, (value, _) in given.items()}
        tensors["input"] = input.movedim(dim, 0).flatten(0, 1)
        tensors["target"] = stacked.reshape(-1, *stacked.shape[2:])
        return [function(**tensors, **rest).unflatten(0, (members, -1))], [0]

    batched = below_vmap(rule, [bound[name] for name in names])
    return function(*args, **kwargs) if batched is None else batched[0]


def shared_noise(draw: Callable[[torch.Tensor], torch.Tensor], input: torch.Tensor) -> torch.Tensor:
    """Multiplicative dropout ``draw(input)``: the noise drawn once, by the same call on ones
    laid out like one member's slice of `input` (``ones_like`` keeps a dense layout, as
    ``empty_like`` does for the unfused noise), and every member multiplied by it."""

    def rule(members: int, values: list[torch.Tensor], dims: list[int | None]) -> tuple[list, list]:
        stacked = values[0].movedim(dims[0], 0)
        return [stacked * draw(torch.ones_like(stacked[0]))], [0]

    batched = below_vmap(rule, [input])
    return draw(input) if batched is None else batched[0]


def channels_last_pool(pool: Callable[[torch.Tensor], Any], input: torch.Tensor) -> list[torch.Tensor]:
    """``pool(input)`` (a 2-d max pooling: its values, and indices if it returns them)
    computed in the channels-last layout and given back contiguous, for every member in one
    call: the members folded into the channels when they sit next to them (a grouped
    convolution's output), else into the batch of images."""

    def rule(members: int, values: list[torch.Tensor], dims: list[int | None]) -> tuple[list, list]:
        input, dim = values[0], dims[0]
        if dim == input.dim() - 4:  # [..., K, C, H, W]: K x C channels
            channels = input.shape[dim + 1]
            outputs = channels_last(pool, input.flatten(dim, dim + 1))
            return [out.unflatten(dim, (members, channels)) for out in outputs], [dim] * len(outputs)
        stacked = input.movedim(dim, 0)
        outputs = channels_last(pool, stacked.reshape(-1, *stacked.shape[-3:]))
        return [out.view(*stacked.shape[:-3], *out.shape[-3:]) for out in outputs], [0] * len(outputs)

    batched = below_vmap(rule, [input])
    return channels_last(pool, input) if batched is None else batched


def channels_last(pool: Callable[[torch.Tensor], Any], input: torch.Tensor) -> list[torch.Tensor]:
    """`pool`'s outputs on `input` laid out channels-last, given back contiguous (as the NCHW
    kernel returns them); each gradient travels back in the layout its side computes in
    (mixed layouts make the elementwise kernels around it slow)."""
    if input.dim() != 4:  # one image [C, H, W]: as a batch of one
        return [out[0] for out in channels_last(pool, input.unsqueeze(0))]
    planes = input.contiguous(memory_format=torch.channels_last)
    if planes.requires_grad:
        planes.register_hook(lambda grad: grad.contiguous())
    output = pool(planes)
    outputs = list(output) if isinstance(output, tuple) else [output]
    if outputs[0].requires_grad:
        outputs[0].register_hook(lambda grad: grad.contiguous(memory_format=torch.channels_last))
    return [out.contiguous() for out in outputs]


class MemberwiseLayers(TorchFunctionMode):
    """Inside a fused step: the operations of the module docstring one member at a time;
    with ``kernels="grouped"`` convolutions and matrix products stay batched."""

    def __init__(self, kernels: str = "exact"):
        super().__init__()
        if kernels not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {list(KERNEL_MODES)}, got {kernels!r}")
        batched = CONVOLUTIONS | MATRIX_PRODUCTS if kernels == "grouped" else frozenset()
        self.memberwise = MEMBERWISE_OPERATIONS - batched

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in MULTIPLICATIVE_DROPOUTS:
            return _dropout(func, args, kwargs)
        if func in MAX_POOLS:
            return _max_pool(func, args, kwargs)
        if func in ROW_LOSSES:
            return row_loss(func, args, kwargs)
        if func in self.memberwise or func in AFFINE_DROPOUTS:
            return memberwise(func, args, kwargs, random=func in RANDOM_OPERATIONS)
        if func is functional.linear and _matrix_vector(args[1] if len(args) > 1 else kwargs.get("weight")):
            return memberwise(func, args, kwargs, random=False)
        return func(*args, **kwargs)


def _dropout(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    rest = list(args)
    input = rest.pop(0) if rest else kwargs.pop("input")
    if not isinstance(input, torch.Tensor):
        return func(input, *rest, **kwargs)
    if func not in (torch.dropout, torch.feature_dropout):  # functional's: in place or not, a
        if len(rest) >= 3:  # fused step returns a new tensor (the stacked input is kept)
            rest[2] = False
        else:
            kwargs["inplace"] = False
    return shared_noise(lambda x: func(x, *rest, **kwargs), input)


def _max_pool(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    rest = list(args)
    input = rest.pop(0) if rest else kwargs.pop("input")
    indices = func is functional.max_pool2d_with_indices or bool(
        rest[5] if len(rest) > 5 else kwargs.get("return_indices", False)
    )
    outputs = channels_last_pool(lambda x: func(x, *rest, **kwargs), input)
    return tuple(outputs) if indices else outputs[0]


def _matrix_vector(weight: Any) -> bool:
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and min(weight.shape) == 1
