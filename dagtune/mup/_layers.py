"""Layers whose forward pass depends on the parametrization: the readout and self-attention.

A `WidthAware` module is told, when `dagtune.mup.build` builds the model, its counterpart at
the base width and the parametrization; it then sets what its forward pass needs (the
readout's input multiplier, the attention's logit scale) and any initialization muP asks of
it (zero readout, zero query). Under the standard parametrization both behave exactly like
their plain PyTorch counterparts.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from dagtune.mup._shapes import Parametrization

__all__ = ["Readout", "SelfAttention", "WidthAware"]


class WidthAware(ABC):
    """A module that adapts its forward pass or initialization to its width under muP."""

    @abstractmethod
    def configure_width(self, base: nn.Module, parametrization: Parametrization) -> None:
        """Adapt to this width; `base` is the same module at the base width (on the meta
        device: read its shape attributes, not its values)."""


class Readout(nn.Linear, WidthAware):
    """The output layer: maps the width to a fixed size (classes, vocabulary).

    Under muP its input is multiplied by ``output_mult / width_mult``, where ``width_mult`` is
    its fan-in over the base fan-in, and its weight starts at zero (its bias too, as every
    bias under muP): the output-multiplier form of muP's output-layer rule (Yang et al.,
    Tensor Programs V), with Hydro's zero readout (§4.1). With a fixed ``output_mult`` the logits of
    a model narrower than the base are amplified as much as its fan-in is smaller, which keeps
    the logits' updates the same size at every width. Under the standard parametrization it is
    an ``nn.Linear`` with ``output_mult`` applied.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        output_mult: float = 1.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        if not output_mult > 0:
            raise ValueError(f"Readout output_mult must be positive, got {output_mult!r}")
        self.output_mult = float(output_mult)
        self.width_mult = 1.0

    def configure_width(self, base: nn.Module, parametrization: Parametrization) -> None:
        if not isinstance(base, Readout):
            raise TypeError(f"the base-width counterpart of a Readout is a {type(base).__name__}")
        if base.out_features != self.out_features:
            raise ValueError(
                f"a Readout's out_features must not change with width: {base.out_features} at the base "
                f"width, {self.out_features} here"
            )
        if parametrization == "mup":
            self.width_mult = self.in_features / base.in_features
            with torch.no_grad():
                self.weight.zero_()
        else:
            self.width_mult = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x * (self.output_mult / self.width_mult), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, output_mult={self.output_mult}, width_mult={self.width_mult:g}"


class SelfAttention(nn.Module, WidthAware):
    """Multi-head self-attention on ``(batch, time, d_model)`` inputs.

    Under the standard parametrization the attention logits are ``q·k / sqrt(head_dim)``;
    under muP they are ``q·k * sqrt(base_head_dim) / head_dim``, proportional to
    ``1 / head_dim`` (Tensor Programs V: q and k become correlated during training, so
    their dot product grows like ``head_dim``, not its square root) and equal to the standard
    scale at the base width; the query projection starts at zero. When the width is scaled
    through the number of heads (``head_dim`` fixed), the scale does not change.
    """

    def __init__(self, d_model: int, n_heads: int, causal: bool = False, bias: bool = True):
        super().__init__()
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(f"SelfAttention: d_model {d_model} is not a multiple of n_heads {n_heads}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.causal = bool(causal)
        self.query = nn.Linear(d_model, d_model, bias=bias)
        self.key = nn.Linear(d_model, d_model, bias=bias)
        self.value = nn.Linear(d_model, d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)
        self.scale = self.head_dim**-0.5

    def configure_width(self, base: nn.Module, parametrization: Parametrization) -> None:
        if not isinstance(base, SelfAttention):
            raise TypeError(f"the base-width counterpart of a SelfAttention is a {type(base).__name__}")
        if parametrization == "mup":
            self.scale = math.sqrt(base.head_dim) / self.head_dim
            with torch.no_grad():
                self.query.weight.zero_()
        else:
            self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape

        def heads(projection: nn.Linear) -> torch.Tensor:
            return projection(x).view(batch, time, self.n_heads, self.head_dim).transpose(1, 2)

        mixed = F.scaled_dot_product_attention(
            heads(self.query), heads(self.key), heads(self.value), is_causal=self.causal, scale=self.scale
        )
        return self.out(mixed.transpose(1, 2).reshape(batch, time, self.d_model))

    def extra_repr(self) -> str:
        return (
            f"n_heads={self.n_heads}, head_dim={self.head_dim}, causal={self.causal}, scale={self.scale:.4g}"
        )
