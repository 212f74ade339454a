"""The tokenmix ViT: timm's ``VisionTransformer`` with swappable token interaction.

Two independent axes, chosen by the variant name (``backbones/variants.py``):
- attention normaliser, passed to the constructor of every block's ``attn_layer`` (``TokenMixAttention``);
- global-token strategy: ``cls`` | ``registers`` (DINOv2 placement) | ``specialization`` (``block_fn``)
  | ``lastvit`` (frequency-aware top-K aggregation replaces the [CLS] output); what each one changes is
  one row of ``STRATEGY_RULES``.

State-dict keys are timm's, which are also DINO's released keys (``cls_token``, ``pos_embed``,
``patch_embed.proj.*``, ``blocks.N.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*``, ``norm.*``);
extras are ``reg_token`` and ``*_cls`` specialised parameters.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from timm.layers import resample_abs_pos_embed, trunc_normal_
from timm.models.vision_transformer import VisionTransformer

from .attention import attention_layer
from .block import TokenMixBlock
from .linear import use_fast_linears
from .config import ARCHS, SHAPE_FIELDS, BackboneConfig
from .entmax_fast import DEFAULT_BACKEND
from .lastvit import FrequencyTopKPooling
from .specialization import COMPONENTS, SpecializedBlock, specialization_sets
from .variants import Normalizer, Strategy, parse_variant

@dataclass(frozen=True)
class StrategyRule:
    """What one global-token strategy changes in the ViT, from the knobs (``TokenMixViT`` arguments)."""
    knobs: tuple[str, ...] = ()  # recorded in ``model.backbone_config`` (and so in checkpoints)
    block_fn: Callable[[dict], Any] | None = None  # knobs -> timm block_fn
    registers: Callable[[dict], int] = lambda kn: 0  # knobs -> number of register tokens
    aggregator: Callable[[int, dict], nn.Module] | None = None  # (embed_dim, knobs) -> replaces the [CLS] output


STRATEGY_RULES: dict[Strategy, StrategyRule] = {
    Strategy.CLS: StrategyRule(),
    Strategy.REGISTERS: StrategyRule(knobs=("num_registers",), registers=lambda kn: kn["num_registers"]),
    Strategy.SPECIALIZATION: StrategyRule(
        knobs=("spec_blocks", "spec_components", "spec_norm_blocks", "spec_qkv_blocks"),
        block_fn=lambda kn: partial(SpecializedBlock, spec_sets=specialization_sets(
            tuple(kn["spec_blocks"]), kn["spec_components"], kn["spec_norm_blocks"], kn["spec_qkv_blocks"]))),
    Strategy.LASTVIT: StrategyRule(
        knobs=("lastvit_k", "lastvit_sigma", "lastvit_reference"),
        aggregator=lambda dim, kn: FrequencyTopKPooling(dim, k=kn["lastvit_k"], sigma=kn["lastvit_sigma"],
                                                        reference=bool(kn["lastvit_reference"]))),
}
NORMALIZER_KNOBS: dict[Normalizer, tuple[str, ...]] = {Normalizer.ENTMAX_BISECT: ("alpha", "bisect_iters")}


class TokenMixViT(VisionTransformer):
    """``entmax_backend``: kernel of the entmax-1.5/sparsemax attention (auto | cpp | torch, see
    ``backbones/entmax_fast.py``); ``linear_backend``: GEMM of the blocks' linear layers on a CPU (auto | aten |
    onednn, see ``backbones/linear.py``); runtime choices, not part of ``config``."""

    def __init__(self, *, arch: str, variant: str = "softmax", num_registers: int = 4,
                 spec_blocks: Optional[Sequence[int]] = None, spec_components: Sequence[str] = COMPONENTS,
                 spec_norm_blocks: Optional[Sequence[int]] = None, spec_qkv_blocks: Optional[Sequence[int]] = None,
                 lastvit_k: int = 1, lastvit_sigma: Optional[float] = None, alpha: float = 1.5,
                 bisect_iters: int = 50, entmax_backend: str = DEFAULT_BACKEND, lastvit_reference: bool = False,
                 num_classes: int = 0, linear_backend: str = "auto", pos_interp: Optional[str] = None,
                 global_pool: bool = False, **vit_kwargs: Any) -> None:
        spec = parse_variant(variant)
        rule = STRATEGY_RULES[spec.strategy]
        knobs = dict(num_registers=num_registers, lastvit_k=lastvit_k, lastvit_sigma=lastvit_sigma,
                     lastvit_reference=lastvit_reference or None, alpha=alpha,
                     bisect_iters=bisect_iters, spec_components=list(spec_components),
                     spec_blocks=list(range(4)) if spec_blocks is None else [int(b) for b in spec_blocks],
                     spec_norm_blocks=None if spec_norm_blocks is None else sorted(int(b) for b in spec_norm_blocks),
                     spec_qkv_blocks=None if spec_qkv_blocks is None else sorted(int(b) for b in spec_qkv_blocks))
        vit_kwargs["block_fn"] = TokenMixBlock if rule.block_fn is None else rule.block_fn(knobs)
        vit_kwargs.setdefault("norm_layer", partial(nn.LayerNorm, eps=1e-6))
        attn = attention_layer(normalizer=spec.normalizer, alpha=alpha, bisect_iters=bisect_iters,
                               entmax_backend=entmax_backend)
        # global_pool (MAE's): timm's "avg" makes `norm` an Identity and adds `fc_norm`, MAE's keys; the pooling
        # itself is `_split`'s (timm's forward_head is not used)
        super().__init__(num_classes=num_classes, global_pool="avg" if global_pool else "token", qkv_bias=True,
                         mlp_ratio=4.0, dynamic_img_size=True, attn_layer=attn, **vit_kwargs)
        self.arch, self.variant, self.spec, self.pos_interp = arch, spec.name, spec, pos_interp
        self.pooled = bool(global_pool)
        self.patch_size = self.patch_embed.patch_size[0]
        self.depth = len(self.blocks)
        self.num_heads = self.blocks[0].attn.num_heads
        trunc_normal_(self.cls_token, std=0.02)  # DINO's init (timm uses N(0, 1e-6))

        # registers: DINOv2 placement (after [CLS], no positional embedding) and init N(0, 1e-6)
        n_reg = rule.registers(knobs)
        self.reg_token = nn.Parameter(torch.randn(1, n_reg, self.embed_dim) * 1e-6) if n_reg else None
        self.num_reg_tokens = n_reg
        self.num_prefix_tokens = 1 + n_reg

        self.aggregator = rule.aggregator(self.embed_dim, knobs) if rule.aggregator is not None else None
        use_fast_linears(self.blocks, linear_backend)

        recorded = rule.knobs + NORMALIZER_KNOBS.get(spec.normalizer, ())
        self.backbone_config = BackboneConfig(arch, spec.name, **self._shape_overrides(arch),
                                              **{k: knobs[k] for k in recorded}, num_classes=num_classes,
                                              init_values=vit_kwargs.get("init_values"), pos_interp=pos_interp,
                                              global_pool=self.pooled)
        # the plain dict of the config (results.json, logs); num_classes only with a classifier head
        self.config: dict[str, Any] = self.backbone_config.to_dict()

    def _shape_overrides(self, arch: str) -> dict[str, int]:
        """The shape values that differ from ``ARCHS[arch]`` (e.g. ``img_size`` of a preset): recorded so a
        checkpoint rebuilds the same positional embedding."""
        h, w = self.patch_embed.img_size
        have = dict(img_size=h if h == w else (h, w), patch_size=self.patch_size, embed_dim=self.embed_dim,
                    depth=self.depth, num_heads=self.num_heads)
        return {k: have[k] for k in SHAPE_FIELDS if have[k] != ARCHS[arch][k]}

    # -- tokens -------------------------------------------------------------------------------------
    def interpolate_pos_encoding(self, gh: int, gw: int) -> torch.Tensor:
        """Bicubic interpolation of the patch position table to the input's grid, by the source model's rule
        (``pos_interp``): None, DINO's and DINOv2's default (scale factor (g + 0.1) / M, no antialias);
        ``"dinov2_reg"``, DINOv2's ``*_reg`` hub models (``interpolate_offset=0``: output size, antialiased);
        ``"timm"``: timm's ``resample_abs_pos_embed`` (output size, antialiased), as timm's ``dynamic_img_size``
        forward of checkpoints given by a timm model name (``backbones/foreign.py``)."""
        pos = self.pos_embed
        n = pos.shape[1] - 1
        side = int(math.sqrt(n))
        if gh * gw == n and gh == gw:
            return pos
        if self.pos_interp == "timm":
            return resample_abs_pos_embed(pos, new_size=(gh, gw), old_size=(side, side), num_prefix_tokens=1)
        patch_pos = pos[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2).float()
        if self.pos_interp == "dinov2_reg":
            patch_pos = F.interpolate(patch_pos, size=(gh, gw), mode="bicubic", antialias=True).to(pos.dtype)
        else:
            patch_pos = F.interpolate(patch_pos, scale_factor=((gh + 0.1) / side, (gw + 0.1) / side),
                                      mode="bicubic").to(pos.dtype)
        assert patch_pos.shape[-2:] == (gh, gw)
        return torch.cat([pos[:, :1], patch_pos.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], dim=1)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        B, gh, gw, C = x.shape  # PatchEmbed in dynamic mode returns NHWC
        x = torch.cat([self.cls_token.expand(B, -1, -1), x.reshape(B, gh * gw, C)], dim=1)
        x = x + self.interpolate_pos_encoding(gh, gw)
        if self.reg_token is not None:
            x = torch.cat([x[:, :1], self.reg_token.expand(B, -1, -1), x[:, 1:]], dim=1)
        return self.pos_drop(x)

    def grid_size(self, images: torch.Tensor) -> tuple[int, int]:
        return images.shape[-2] // self.patch_size, images.shape[-1] // self.patch_size

    # -- outputs ------------------------------------------------------------------------------------
    def _split(self, y: torch.Tensor, last: bool, votes: bool) -> dict[str, torch.Tensor]:
        out = {"cls": y[:, 0], "patch": y[:, self.num_prefix_tokens:]}
        if self.pooled:  # MAE's global pool: y is un-normalised (norm is an Identity); [CLS] itself is not read
            out["cls"] = self.fc_norm(out["patch"].mean(dim=1))
        if last and self.aggregator is not None:
            out["cls"], v = self.aggregator(out["patch"])
            if votes:
                out["votes"] = v
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The [CLS] output (B, D) after the final norm (``lastvit``: the aggregated token; ``global_pool``:
        ``fc_norm`` of the mean patch token); with ``num_classes`` > 0 the logits of the linear ``head`` on it.

        Only [CLS] is a query in the last block (``TokenMixBlock.forward_queries``): the other tokens' last-block
        outputs never reach it. ``lastvit`` aggregates the patch tokens, so it runs the whole last block, as does
        a last block someone watches (hooks on it or its ``attn``, ``attn.record``: ``TokenMixBlock.observed``)."""
        last = self.blocks[-1]
        if self.aggregator is not None or self.pooled or self.grad_checkpointing \
                or not hasattr(last, "forward_queries") or last.observed():
            return self.head(self._split(self.forward_features(x), last=True, votes=False)["cls"])
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(x))))
        for blk in self.blocks[:-1]:
            x = blk(x)
        return self.head(self.norm(last.forward_queries(x, 1))[:, 0])

    def extract(self, images: torch.Tensor, n_last_blocks: int = 1, blocks: Optional[Sequence[int]] = None,
                votes: bool = False) -> list[dict[str, torch.Tensor]]:
        """[CLS]/patch outputs of the chosen blocks through the final norm, oldest first, registers removed.
        ``global_pool`` (MAE): no final norm, so each block's patch tokens as it outputs them (what MAE's mean
        pools), and as "cls" ``fc_norm`` of their mean (for the last block, MAE's ``forward_features``)."""
        if blocks is None:
            if not 1 <= n_last_blocks <= self.depth:
                raise ValueError(f"n_last_blocks must be in 1..{self.depth}, got {n_last_blocks}")
            take = list(range(self.depth - n_last_blocks, self.depth))
        else:
            take = sorted({int(b) % self.depth for b in blocks})
            if any(not -self.depth <= int(b) < self.depth for b in blocks):
                raise ValueError(f"block indices must be in -{self.depth}..{self.depth - 1}, got {list(blocks)}")
        x = self.norm_pre(self.patch_drop(self._pos_embed(self.patch_embed(images))))
        outs = []
        for i, blk in enumerate(self.blocks[: take[-1] + 1]):
            x = blk(x)
            if i in take:
                outs.append(self._split(self.norm(x), last=i == self.depth - 1, votes=votes))
        return outs

    @contextmanager
    def recording(self, blocks: Sequence[int]) -> Iterator[list]:
        """Inside the ``with``, the attention layers of ``blocks`` keep their last weights in ``last_attn`` (the
        explicit attention lines instead of a fused kernel: equal to float rounding); cleared on exit."""
        attns = [self.blocks[int(i) % self.depth].attn for i in blocks]
        for a in attns:
            a.record = True
        try:
            yield attns
        finally:
            for a in attns:
                a.record, a.last_attn = False, None

    def forward_record(self, images: torch.Tensor, record: Sequence[int] = ()):
        """One forward of (normalised) ``images``: the last block's [CLS] (B, D), patches (B, N, D), patch grid
        (B, D, h, w) and the attention weights (B, heads, T, T) of blocks ``record``: the one path of every dense
        measure (``tokenmix.dense_measures``)."""
        with self.recording(record) as attns:
            o = self.extract(images, n_last_blocks=1)[-1]
            weights = [a.last_attn for a in attns]
        (h, w), (B, N, D) = self.grid_size(images), o["patch"].shape
        return o["cls"], o["patch"], o["patch"].transpose(1, 2).reshape(B, D, h, w), weights

    @torch.no_grad()
    def attention_maps(self, images: torch.Tensor, blocks: Optional[Sequence[int]] = None) -> list[torch.Tensor]:
        """Attention probabilities (B, heads, T, T) of the chosen blocks (all by default)."""
        take = range(self.depth) if blocks is None else sorted({int(b) % self.depth for b in blocks})
        with self.recording(take) as attns:
            self.forward_features(images)
            return [a.last_attn for a in attns]

    def get_last_selfattention(self, images: torch.Tensor) -> torch.Tensor:
        return self.attention_maps(images, blocks=[self.depth - 1])[0]

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token", "reg_token"}


def create_vit(arch: str = "vit_small_patch16", variant: str = "softmax", seed: Optional[int] = None,
               **overrides: Any) -> TokenMixViT:
    """Build a backbone by architecture and variant name, e.g. ``create_vit("vit_small_patch16", "entmax+lastvit")``.

    ``seed``: draw the initial weights from ``torch.manual_seed(seed)`` inside a forked CPU RNG, so the same seed
    gives the same weights and the caller's global RNG stream is left as it was. ``None``: the global RNG.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch '{arch}'; valid: {', '.join(ARCHS)}")
    kwargs = {**ARCHS[arch], **overrides}
    if seed is None:
        return TokenMixViT(arch=arch, variant=variant, **kwargs)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TokenMixViT(arch=arch, variant=variant, **kwargs)
