"""``BackboneConfig``: what rebuilds a backbone; every checkpoint tokenmix writes carries one as a plain dict
(``create_vit(**cfg.to_dict())`` rebuilds it; ``from_dict`` raises CheckpointError on an unknown or missing field).

A field left ``None`` is the constructor's default and is not written, so the dicts older checkpoints hold read
back to the same config.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from tokenmix.io import CheckpointError

from .variants import Strategy, parse_variant

# name -> ViT shape. All: mlp_ratio 4, qkv_bias, LayerNorm eps 1e-6 (DINO's vision_transformer.py).
ARCHS: dict[str, dict[str, int]] = {
    "vit_tiny_patch16": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, img_size=224),
    "vit_small_patch16": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6, img_size=224),
    "vit_base_patch16": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12, img_size=224),
    "vit_small_patch8": dict(patch_size=8, embed_dim=384, depth=12, num_heads=6, img_size=224),
    "vit_large_patch16": dict(patch_size=16, embed_dim=1024, depth=24, num_heads=16, img_size=224),
    "vit_huge_patch14": dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, img_size=224),
    # DINOv2's shapes (a 37 x 37 position grid), so released weights load by their shapes (backbones/foreign.py)
    "vit_small_patch14": dict(patch_size=14, embed_dim=384, depth=12, num_heads=6, img_size=518),
    "vit_base_patch14": dict(patch_size=14, embed_dim=768, depth=12, num_heads=12, img_size=518),
    "vit_large_patch14": dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, img_size=518),
    # the CPU demo (64 px scenes) and the test suite
    "vit_demo_patch8": dict(patch_size=8, embed_dim=128, depth=4, num_heads=2, img_size=64),
    "vit_test_patch8": dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, img_size=32),
}
SHAPE_FIELDS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads")
POS_INTERP = (None, "timm", "dinov2_reg")  # TokenMixViT.interpolate_pos_encoding
_SEQUENCES = ("spec_blocks", "spec_components", "spec_norm_blocks", "spec_qkv_blocks")


@dataclass(frozen=True, repr=False)
class BackboneConfig:
    """The ``create_vit`` arguments that decide a backbone's weights and forward (not runtime choices such as
    ``entmax_backend`` or training ones such as ``drop_path_rate``)."""
    arch: str
    variant: str = "softmax"
    # the arch's shape (ARCHS), recorded only where a run overrides it
    img_size: Optional[int] = None
    patch_size: Optional[int] = None
    embed_dim: Optional[int] = None
    depth: Optional[int] = None
    num_heads: Optional[int] = None
    num_registers: Optional[int] = None                  # registers
    spec_blocks: Optional[tuple[int, ...]] = None        # specialization
    spec_components: Optional[tuple[str, ...]] = None
    spec_norm_blocks: Optional[tuple[int, ...]] = None
    spec_qkv_blocks: Optional[tuple[int, ...]] = None
    lastvit_k: Optional[int] = None                      # lastvit
    lastvit_sigma: Optional[float] = None
    lastvit_reference: Optional[bool] = None
    alpha: Optional[float] = None                        # entmax_bisect
    bisect_iters: Optional[int] = None
    init_values: Optional[float] = None                  # LayerScale (ls1/ls2.gamma: DINOv2, DeiT III); its init
    pos_interp: Optional[str] = None                     # position-table resampling: None (DINO), "timm", "dinov2_reg"
    global_pool: Optional[bool] = None                   # MAE's: [CLS] output = fc_norm(mean patch token), no norm
    num_classes: int = 0                                 # classifier head (label-supervised); 0: features only

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch '{self.arch}'; valid: {', '.join(ARCHS)}")
        object.__setattr__(self, "variant", parse_variant(self.variant).name)  # ValueError naming the valid ones
        if self.pos_interp not in POS_INTERP:
            raise ValueError(f"pos_interp must be one of {POS_INTERP}, got {self.pos_interp!r}")
        if self.global_pool not in (None, False, True):
            raise ValueError(f"global_pool must be true or false, got {self.global_pool!r}")
        if not self.global_pool:  # off is None: not written, so configs without the field read back equal
            object.__setattr__(self, "global_pool", None)
        elif parse_variant(self.variant).strategy is Strategy.LASTVIT:
            raise ValueError("global_pool and lastvit both replace the [CLS] output: choose one")
        for name in _SEQUENCES:  # lists from YAML / checkpoints -> tuples (hashable, frozen)
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(value))

    def __repr__(self) -> str:  # the set fields only
        return f"BackboneConfig({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (``torch.load(weights_only=True)`` and JSON read it): the set fields."""
        out: dict[str, Any] = {"arch": self.arch, "variant": self.variant}
        for f in dataclasses.fields(self)[2:]:
            value = getattr(self, f.name)
            if value is not None and not (f.name == "num_classes" and not value):
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "checkpoint") -> "BackboneConfig":
        """Read a recorded config; ``CheckpointError`` naming the fields when it is not one this version builds."""
        if not isinstance(d, Mapping):
            raise CheckpointError(f"{source}: the backbone config is a {type(d).__name__}, not a dict")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        missing = [k for k in ("arch", "variant") if k not in d]
        if unknown or missing:
            what = f"unknown fields {unknown}" if unknown else f"no {missing} field"
            raise CheckpointError(f"{source}: incompatible backbone config ({what}; known fields: {', '.join(known)}). "
                                  "It was written by another version of tokenmix or another project: build the "
                                  "backbone with backbones.create_vit and load the weights with load_checkpoint.")
        try:
            return cls(**{k: v for k, v in d.items() if v is not None})
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{source}: incompatible backbone config {dict(d)}: {e}") from e

    def replace(self, **changes: Any) -> "BackboneConfig":
        return dataclasses.replace(self, **changes)
