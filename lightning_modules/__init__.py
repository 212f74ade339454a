"""DINO (v1) pretraining: head, loss, schedules, the LightningModule and its CLI (``make pretrain``)."""
from lightning_modules.dino_head import DINOHead, MultiCropWrapper, WeightNormLinear
from lightning_modules.dino_loss import DINOLoss
from lightning_modules.dino_optim import cancel_gradients_last_layer, cosine_scheduler, get_params_groups

__all__ = ["DINOHead", "MultiCropWrapper", "WeightNormLinear", "DINOLoss", "cosine_scheduler", "get_params_groups",
           "cancel_gradients_last_layer"]
