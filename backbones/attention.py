"""Self-attention with a swappable normaliser, as timm's ``attn_layer`` (timm's ``Attention`` subclassed: its
parameter names and init). ``normalizer``: softmax through SDPA; entmax-1.5 / sparsemax through the Triton kernel
on CUDA, the fused ``entmax_fast.sparse_attention`` elsewhere without autocast; otherwise (and whenever the weights
are recorded, masked or dropped out) DINO's explicit ``attn = normalizer((q @ k^T) * scale); x = attn @ v``.
``qkv_cls``: a separate q/k/v projection for [CLS] (specialization); ``record = True`` keeps ``last_attn``.
"""
from __future__ import annotations

from functools import lru_cache, partialmethod
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from timm.models.vision_transformer import Attention

from .compile_ops import sparse_attention_op
from .entmax_fast import DEFAULT_BACKEND, sparse_attention
from .normalizers import Normalizer, build_normalizer


def _triton_kernel(q: torch.Tensor):
    """backbones.triton_attention for CUDA tensors when Triton is installed (imported on first CUDA use), else
    None: a mixed-precision run then takes the unfused lines (matmuls under autocast, the normaliser in fp32)."""
    if not q.is_cuda:
        return None
    from . import triton_attention
    return triton_attention if triton_attention.available(q) else None


class TokenMixAttention(Attention):
    def __init__(self, dim: int, num_heads: int = 8, *, normalizer: str = "softmax", alpha: float = 1.5,
                 bisect_iters: int = 50, entmax_backend: str = DEFAULT_BACKEND, **kwargs) -> None:
        super().__init__(dim, num_heads=num_heads, **kwargs)
        self.normalizer: Optional[Normalizer] = build_normalizer(normalizer, alpha=alpha, n_iter=bisect_iters,
                                                                 backend=entmax_backend)
        self.entmax_backend = entmax_backend
        self.qkv_cls: Optional[nn.Linear] = None
        self.record = False
        self.last_attn: Optional[torch.Tensor] = None

    def _qkv(self, x: torch.Tensor) -> torch.Tensor:
        if self.qkv_cls is None:
            return self.qkv(x)
        return torch.cat([self.qkv_cls(x[:, :1]), self.qkv(x[:, 1:])], dim=1)

    def _heads(self, x: torch.Tensor, n: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q of the first ``n`` tokens (all if None), k and v of every token, each (B, heads, tokens, head_dim)."""
        B, N, _ = x.shape
        if n is None or self.qkv_cls is not None:
            qkv = self._qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)
            q = q if n is None else q[:, :, :n]
        else:  # the q rows of the weight for the first n tokens only, k and v rows for all
            D, w, b = self.attn_dim, self.qkv.weight, self.qkv.bias
            lin = getattr(self.qkv, "functional", F.linear)  # the layer's own GEMM backend (backbones/linear.py)
            q = lin(x[:, :n], w[:D], None if b is None else b[:D])
            q = q.reshape(B, n, self.num_heads, self.head_dim).transpose(1, 2)
            kv = lin(x, w[D:], None if b is None else b[D:])
            k, v = kv.reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(q), self.k_norm(k), v

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False) -> torch.Tensor:
        return self._attend(*self._heads(x, None), attn_mask, is_causal)

    def forward_queries(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``self(x)[:, :n]``: every token a key and value, only the first ``n`` tokens queries (no mask)."""
        return self._attend(*self._heads(x, n), None, False)

    def _attend(self, q, k, v, attn_mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
        B, _, n, _ = q.shape
        fused_kind = getattr(self.normalizer, "fused_kind", None)
        plain = not self.record and attn_mask is None and not is_causal and not (self.training and self.attn_drop.p > 0)
        if self.normalizer is None and not self.record:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                dropout_p=self.attn_drop.p if self.training else 0.0)
        elif fused_kind is not None and plain and _triton_kernel(q) is not None:
            x = _triton_kernel(q).sparse_attention(q, k, v, self.scale, fused_kind)
        elif fused_kind is not None and plain and not torch.is_autocast_enabled(q.device.type):
            # under torch.compile the C++ kernel runs as an opaque custom op (no graph break); eager: directly
            fn = sparse_attention_op if torch.compiler.is_compiling() else sparse_attention
            x = fn(q, k, v, self.scale, fused_kind, backend=self.entmax_backend).to(v.dtype)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            if attn_mask is not None:
                attn = attn + attn_mask if attn_mask.dtype != torch.bool else attn.masked_fill(~attn_mask, float("-inf"))
            attn = attn.softmax(dim=-1) if self.normalizer is None else self.normalizer(attn)
            if self.record:
                self.last_attn = attn.detach()
            x = self.attn_drop(attn) @ v
        x = x.transpose(1, 2).reshape(B, n, self.attn_dim)
        return self.proj_drop(self.proj(self.norm(x)))


def _rebuild(bound: tuple) -> "TokenMixAttention":
    return TokenMixAttention.__new__(attention_layer(**dict(bound)))


@lru_cache(maxsize=None)
def _bound_class(bound: tuple) -> type:
    def __reduce_ex__(self, protocol):  # pickle by its arguments: the class itself is made here, not importable
        return _rebuild, (bound,), self.__getstate__()

    return type("TokenMixAttention", (TokenMixAttention,),
                {"__init__": partialmethod(TokenMixAttention.__init__, **dict(bound)), "__reduce_ex__": __reduce_ex__,
                 "__module__": __name__, "__doc__": f"TokenMixAttention with {dict(bound)}"})


def attention_layer(**kwargs) -> type:
    """``functools.partial(TokenMixAttention, **kwargs)`` as a class (timm 1.0 calls ``issubclass(attn_layer,
    ...)``); one class per argument set, picklable."""
    return _bound_class(tuple(sorted((k, str(v) if isinstance(v, str) else v) for k, v in kwargs.items())))
