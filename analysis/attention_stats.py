"""Attention statistics live in ``tokenmix/attention_stats.py`` (pretraining's TensorBoard scalars use them too);
re-exported here for the analyses."""
from tokenmix.attention_stats import attention_stats, attention_stats_per_layer, cls_attention_maps

__all__ = ["attention_stats", "attention_stats_per_layer", "cls_attention_maps"]
