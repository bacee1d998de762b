"""FedRevive core (pure PyTorch): staleness-weighted blending of stale client updates with server-side
data-free knowledge distillation (Askin et al., arXiv 2511.00655)."""

from fedrevive.config import FedReviveConfig
from fedrevive.distill import FedReviveDistiller, kd_step
from fedrevive.staleness import beta, blend_update

__all__ = ["FedReviveConfig", "FedReviveDistiller", "beta", "blend_update", "kd_step"]
