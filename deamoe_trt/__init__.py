"""deamoe-trt: take DeaMoE models (department-then-expert MoE) to NVIDIA GPUs."""

from .config import DeaMoEConfig
from .errors import CheckpointError, DeaMoEError, MissingDependencyError, UsageError
from .hf.registration import install as _install_hf
from .layer import DeaMoELayer, DeaMoEStack
from .presets import PRESETS, get_preset
from .quant import QuantConfig
from .routing import Routing, route, route_logits
from .traffic import StepTraffic, weights_loaded

# AutoConfig / AutoModelForCausalLM learn model_type "deamoe" once transformers loads them.
_install_hf()

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "CheckpointError",
    "DeaMoEConfig",
    "DeaMoEError",
    "DeaMoELayer",
    "DeaMoEStack",
    "MissingDependencyError",
    "QuantConfig",
    "Routing",
    "StepTraffic",
    "UsageError",
    "from_hf",
    "from_hf_model",
    "get_preset",
    "route",
    "route_logits",
    "weights_loaded",
]


def from_hf(module, **kwargs):
    """A DeaMoELayer with the same outputs as a Hugging Face MoE block (see importers.hf)."""
    from .importers.hf import from_hf as _from_hf

    return _from_hf(module, **kwargs)


def from_hf_model(model, **kwargs):
    """Every MoE layer of a Hugging Face model as a DeaMoEStack (see importers.hf)."""
    from .importers.hf import from_hf_model as _from_hf_model

    return _from_hf_model(model, **kwargs)
