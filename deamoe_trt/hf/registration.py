"""DeaMoE's transformers classes registered with AutoConfig and AutoModelForCausalLM.

`import deamoe_trt` calls install(), which imports no transformers: the registration runs
when transformers loads its auto classes (configuration_auto: the config; modeling_auto: the
model), or at once where they are loaded already. Then `AutoModelForCausalLM.from_pretrained(DIR)`
of an export-hf directory builds deamoe_trt.hf.modeling's class without trust_remote_code.

Not in a process that has vLLM loaded: there deamoe_trt.integrations.vllm registers the config
class vLLM reads for the same model_type.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

CONFIG_AUTO = "transformers.models.auto.configuration_auto"
MODELING_AUTO = "transformers.models.auto.modeling_auto"


def register_config() -> None:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .configuration import DeaMoEPretrainedConfig

    if DeaMoEPretrainedConfig.model_type not in CONFIG_MAPPING:
        AutoConfig.register(DeaMoEPretrainedConfig.model_type, DeaMoEPretrainedConfig)


def register_model() -> None:
    from transformers import AutoModelForCausalLM

    from .configuration import DeaMoEPretrainedConfig
    from .modeling import DeaMoEForCausalLM

    register_config()
    AutoModelForCausalLM.register(DeaMoEPretrainedConfig, DeaMoEForCausalLM, exist_ok=True)


_ACTIONS: dict[str, Callable[[], None]] = {CONFIG_AUTO: register_config, MODELING_AUTO: register_model}


def _run(name: str) -> None:
    if "vllm" in sys.modules:
        return
    try:
        _ACTIONS[name]()
    except Exception as exc:  # a transformers this version cannot register with must still load
        warnings.warn(f"deamoe-trt could not register its transformers classes: {exc}", stacklevel=3)


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _run(self.name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the auto modules so that registration runs
    once each has loaded."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _ACTIONS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader, name)
                return spec
        return None


def install() -> None:
    """Register now for the auto modules already loaded, and when the others load."""
    if any(isinstance(f, _AfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AfterImport())
    for name in _ACTIONS:
        if name in sys.modules:
            _run(name)
