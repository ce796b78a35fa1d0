"""DeaMoE language models on NVIDIA TensorRT Edge-LLM: its model directories (`deamoe-trt
export-edgellm`), their validation and the device check (`deamoe-trt check-edgellm`).

Edge-LLM's own exporter writes the directory; each MoE layer in its graph is one DeaMoE
plugin node (deamoe_trt.contract) instead of its Fp16MoePlugin/Int4MoePlugin, because Edge-LLM
has no way to say departments with shared parts. How:
- source.py shows the LM to Edge-LLM as the Hugging Face Qwen3-MoE checkpoint it reads;
- family.py registers a Qwen3-MoE model class whose MoE blocks call a torch custom op, and
  adds that op's ONNX translation (one deamoe_trt::DeaMoE node) to Edge-LLM's table;
- driver.py runs Edge-LLM's `tensorrt-edgellm-export` with both in place;
- environment.py finds the Python that has Edge-LLM (its own environment) and checks its version;
- export.py runs the driver there and puts its output in place;
- validate.py compares the export's graph and DeaMoE nodes with Edge-LLM's own export and the LM;
- device_check.py runs both exports on a GPU with Edge-LLM (`check-edgellm`).
"""

from .environment import PYTHON_ENV, TESTED_VERSIONS, check_version, edgellm_python, installed_version
from .export import SIDECAR, export_edgellm

__all__ = [
    "PYTHON_ENV",
    "SIDECAR",
    "TESTED_VERSIONS",
    "check_version",
    "edgellm_python",
    "export_edgellm",
    "installed_version",
]
