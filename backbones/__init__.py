"""ViT backbones with swappable token interaction (attention normaliser x global-token strategy)."""
from .checkpoint import BackboneCheckpoint, backbone_from_checkpoint, load_checkpoint, read_checkpoint
from .config import BackboneConfig
from .variants import VARIANTS, parse_variant
from .vit import ARCHS, TokenMixViT, create_vit

__all__ = ["ARCHS", "VARIANTS", "BackboneCheckpoint", "BackboneConfig", "TokenMixViT", "backbone_from_checkpoint",
           "create_vit", "load_checkpoint", "parse_variant", "read_checkpoint"]
