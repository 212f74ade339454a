"""DINO projection head and the multi-crop wrapper, as facebookresearch/dino's vision_transformer.py, with its
state-dict keys (``mlp.<i>.weight/bias``, ``last_layer.weight_g/weight_v``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class WeightNormLinear(nn.Module):
    """Bias-free ``Linear`` with weight normalisation, ``W = g * v / ||v||`` (row norm, as weight_norm(dim=0)).
    Plain ``weight_g`` / ``weight_v`` parameters instead of ``nn.utils.weight_norm`` (whose hook breaks deepcopy
    in some torch versions; its successor renames the keys): DINO's key names and, via ``torch._weight_norm``,
    its weight bit for bit."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_g = nn.Parameter(torch.ones(out_features, 1))
        # nn.Linear's default init, as the official layer is built from nn.Linear before weight_norm wraps it
        nn.init.kaiming_uniform_(self.weight_v, a=5 ** 0.5)
        with torch.no_grad():  # weight_norm initialises g = ||v||; DINO then fills g with 1
            self.weight_g.fill_(1.0)

    @property
    def weight(self) -> torch.Tensor:
        # the op nn.utils.weight_norm calls (fused on CPU and CUDA): the official weight bit for bit, in one pass
        # over the 65536 x 256 matrix instead of a multiply and a divide
        return torch._weight_norm(self.weight_v, self.weight_g, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias=False, weight_norm"


class DINOHead(nn.Module):
    """MLP (in -> hidden ... -> bottleneck), L2-normalise, weight-normalised linear to ``out_dim`` prototypes."""

    def __init__(self, in_dim: int, out_dim: int, use_bn: bool = False, norm_last_layer: bool = True,
                 nlayers: int = 3, hidden_dim: int = 2048, bottleneck_dim: int = 256):
        super().__init__()
        nlayers = max(nlayers, 1)
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers: list[nn.Module] = [nn.Linear(in_dim, hidden_dim)]
            if use_bn:
                layers.append(nn.BatchNorm1d(hidden_dim))
            layers.append(nn.GELU())
            for _ in range(nlayers - 2):
                layers.append(nn.Linear(hidden_dim, hidden_dim))
                if use_bn:
                    layers.append(nn.BatchNorm1d(hidden_dim))
                layers.append(nn.GELU())
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.apply(self._init_weights)
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim)
        if norm_last_layer:  # gain fixed to 1: only the direction of each prototype is learned
            self.last_layer.weight_g.requires_grad = False

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        x = F.normalize(x, dim=-1, p=2)
        return self.last_layer(x)


class MultiCropWrapper(nn.Module):
    """Runs the backbone once per group of consecutive same-resolution crops, then the head on all of them."""

    def __init__(self, backbone: nn.Module, head: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        if not isinstance(x, (list, tuple)):
            x = [x]
        # ends of the runs of equal width (official: cumsum(unique_consecutive(...)) on a host tensor; plain Python
        # here, the same indices without a tensor, so a fake-CUDA trace has no host value to read)
        sizes = [inp.shape[-1] for inp in x]
        ends = [i + 1 for i in range(len(sizes)) if i + 1 == len(sizes) or sizes[i + 1] != sizes[i]]
        outs, start = [], 0
        for end in ends:
            out = self.backbone(torch.cat(list(x[start:end])))
            if isinstance(out, tuple):
                out = out[0]
            outs.append(out)
            start = end
        return self.head(torch.cat(outs))
