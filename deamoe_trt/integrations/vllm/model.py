"""DeaMoEForCausalLM: deamoe-trt's language model as a vLLM model class.

vLLM supplies the serving machinery: its paged attention and KV cache (`Attention`, with each
block's sliding window), tensor-parallel projections, vocabulary-parallel embedding and head,
and FusedMoE for the experts, so each platform runs its own kernels (the CPU's grouped GEMMs,
AMX in bfloat16; vLLM's GPU MoE kernels on CUDA, not run here). Everything else is
deamoe-trt's own code, so there is one source of truth for it: the routing (deamoe_trt.routing,
as FusedMoE's custom routing function), RMSNorm, rotary tables and rotation (deamoe_trt.lm),
the router, shared experts and dense MLPs. A model with multi-head latent attention
(DeepSeek-V2/V3) runs vLLM's MLA layer and latent cache (DeaMoELatentAttention).

Each DeaMoE FFN is two FusedMoE layers fed by one routing (deamoe_trt.integrations.vllm.grouping):
the departments' shared parts (D groups, min(g, k) slots per token) and the experts' private
parts (N groups, k slots). Routing is a pure function of the router logits, so each layer's
custom routing function recomputes it from the same logits and both agree exactly.

Weights load from the model directory's model.safetensors under deamoe-trt's names; they are
checked against the LMConfig with the checkpoint reader's own check first. A quantized
directory (deamoe_trt.integrations.vllm.compressed) carries compressed-tensors' quantization_config,
so vLLM hands both FusedMoE layers (and the quantized attention projections and head) its own
quantized methods, which load the re-packed codes per expert through FusedMoE's weight loader;
shared experts and dense MLPs stay deamoe-trt's modules, run from the checkpoint's codes. Where
the FFN choice (ffn_op.ffn_choice) is deamoe-trt's CPU kernel, each FFN's groups are read back
into the checkpoint's own codes and scales (compressed.checkpoint_state) and run there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
)
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention.mla_attention import MLAAttention
from vllm.model_executor.layers.fused_moe import FusedMoEFactory
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.platforms import current_platform

from ...checkpoint import ROUTER_BIAS, check_tensors, dtype_name
from ...layer import DeaMoELayer, Router, SharedExperts
from ...lm.attention import RMSNorm, apply_rope
from ...lm.checkpoint import expected_tensors
from ...lm.config import LMConfig
from ...lm.mla import LATENT_NORM_EPS
from ...lm.model import DeaMoELM, DenseMLP, rope_tables
from ...lm.qlinear import QuantizedLinear
from ...routing import route_logits, router_logits
from .checks import check_mla_backend, check_quantized_platform, platform_name_and_amx
from .compressed import checkpoint_state, is_served_group
from .ffn_op import ffn_choice, register_layer
from .grouping import department_slots, department_slots_per_token, expert_slots


def _lm_config(vllm_config: VllmConfig) -> LMConfig:
    return vllm_config.model_config.hf_config.lm_config()


class DeaMoEAttention(nn.Module):
    """deamoe_trt.lm.attention.Attention's order of operations on vLLM's paged attention."""

    def __init__(self, config: LMConfig, layer: int, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.config = config
        tp = get_tensor_model_parallel_world_size()
        self.tp, self.tp_rank = tp, get_tensor_model_parallel_rank()
        self.num_heads = config.num_heads // tp
        self.num_kv_heads = max(1, config.num_key_value_heads // tp)
        self.q_size, self.kv_size = self.num_heads * config.head_dim, self.num_kv_heads * config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            config.head_dim,
            config.num_heads,
            config.num_key_value_heads,
            bias=config.qkv_bias,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            config.q_dim,
            config.hidden_size,
            bias=config.o_bias,
            quant_config=vllm_config.quant_config,
            prefix=f"{prefix}.o_proj",
        )
        if config.qk_norm != "none":
            per_head = config.qk_norm == "head"
            self.q_norm = RMSNorm(config.head_dim if per_head else config.q_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim if per_head else config.kv_dim, config.rms_norm_eps)
        # gpt-oss's sink logits, this rank's heads; float32 so the checkpoint's values pass unrounded.
        self.sinks = (
            nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32), requires_grad=False)
            if config.attention_sinks
            else None
        )
        self.attn = Attention(
            self.num_heads,
            config.head_dim,
            config.attention_multiplier or config.head_dim**-0.5,
            num_kv_heads=self.num_kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=None,
            per_layer_sliding_window=config.window(layer) or None,
            prefix=f"{prefix}.attn",
            sinks=self.sinks,
        )

    def _full_norms(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """OLMoE's q/k norms span every head: gather the shards, normalise, keep this rank's."""
        if self.tp > 1:
            q, k = tensor_model_parallel_all_gather(q.contiguous()), tensor_model_parallel_all_gather(k.contiguous())
        q, k = self.q_norm(q), self.k_norm(k)
        if self.tp > 1:
            q = q.chunk(self.tp, dim=-1)[self.tp_rank]
            k = k.chunk(self.tp, dim=-1)[self.tp_rank]
        return q, k

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.config
        qkv, _ = self.qkv_proj(x)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if c.qk_norm == "full":
            q, k = self._full_norms(q, k)
        if c.clip_qkv:
            q, k, v = (t.clamp(-c.clip_qkv, c.clip_qkv) for t in (q, k, v))
        tokens = x.shape[0]
        q = q.reshape(tokens, self.num_heads, c.head_dim)
        k = k.reshape(tokens, self.num_kv_heads, c.head_dim)
        if c.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = self.attn(q.reshape(tokens, -1), k.reshape(tokens, -1), v.contiguous())
        return self.o_proj(out)[0]


class DeaMoELatentAttention(nn.Module):
    """deamoe_trt.lm.mla.LatentAttention's projections, latent norms and rotary (deamoe-trt's
    own) around vLLM's MLA attention: its latent cache (c_kv and the rotated k_pe, one
    576-value entry per token at DeepSeek's shapes) and the platform's MLA backend, which
    absorbs kv_b_proj into the queries and outputs as deamoe_trt.lm.mla does."""

    def __init__(self, config: LMConfig, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        c = self.config = config
        quant = vllm_config.quant_config
        tp = get_tensor_model_parallel_world_size()
        self.num_heads = config.num_heads // tp
        qk = c.qk_nope_head_dim + c.qk_rope_head_dim
        if c.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(
                c.hidden_size, c.q_lora_rank, bias=False, quant_config=quant, prefix=f"{prefix}.q_a_proj"
            )
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(
                c.q_lora_rank, c.num_heads * qk, bias=False, quant_config=quant, prefix=f"{prefix}.q_b_proj"
            )
        else:
            self.q_proj = ColumnParallelLinear(
                c.hidden_size, c.num_heads * qk, bias=False, quant_config=quant, prefix=f"{prefix}.q_proj"
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            c.hidden_size,
            c.kv_lora_rank + c.qk_rope_head_dim,
            bias=False,
            quant_config=quant,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
        )
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(
            c.kv_lora_rank,
            c.num_heads * (c.qk_nope_head_dim + c.v_head_dim),
            bias=False,
            quant_config=quant,
            prefix=f"{prefix}.kv_b_proj",
        )
        self.o_proj = RowParallelLinear(
            c.num_heads * c.v_head_dim, c.hidden_size, bias=False, quant_config=quant, prefix=f"{prefix}.o_proj"
        )
        self.mla_attn = MLAAttention(
            num_heads=self.num_heads,
            scale=c.attention_multiplier or qk**-0.5,
            qk_nope_head_dim=c.qk_nope_head_dim,
            qk_rope_head_dim=c.qk_rope_head_dim,
            v_head_dim=c.v_head_dim,
            q_lora_rank=c.q_lora_rank or None,
            kv_lora_rank=c.kv_lora_rank,
            kv_b_proj=self.kv_b_proj,
            cache_config=vllm_config.cache_config,
            quant_config=quant,
            prefix=f"{prefix}.attn",
        )
        check_mla_backend(self.mla_attn.attn_backend, torch.get_default_dtype())

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, tokens = self.config, x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)[0]))[0] if c.q_lora_rank else self.q_proj(x)[0]
        q_nope, q_pe = q.view(tokens, self.num_heads, -1).split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(x)[0].split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        q = torch.cat((q_nope, apply_rope(q_pe, cos, sin)), dim=-1)
        k_pe = apply_rope(k_pe.unsqueeze(1), cos, sin)
        out = self.mla_attn(q, self.kv_a_layernorm(latent), k_pe, output_shape=(tokens, self.num_heads * c.v_head_dim))
        return self.o_proj(out)[0]


class DeaMoEFFN(nn.Module):
    """One DeaMoE FFN: the router, two FusedMoE layers (department shared parts, expert private
    parts) and the optional always-on shared experts. Router and shared experts are
    deamoe_trt.layer's modules (replicated over tensor-parallel ranks); FusedMoE shards the rest."""

    def __init__(self, config: LMConfig, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        moe = self.moe = config.moe
        dtype = torch.get_default_dtype()
        self.router = Router(moe, dtype=torch.float32 if config.float32_router else dtype)
        common = dict(
            hidden_size=moe.hidden_size, renormalize=False, params_dtype=dtype, quant_config=vllm_config.quant_config
        )
        if moe.activation == "swiglu_clamped":  # gpt-oss's activation, its gate and up rows interleaved
            common.update(
                activation="swigluoai", swiglu_limit=moe.swiglu_limit, swiglu_alpha=moe.swiglu_alpha, swiglu_beta=1.0
            )
        if moe.ffn_bias:
            common["has_bias"] = True
        self.departments = (
            FusedMoEFactory(
                num_experts=moe.num_departments,
                top_k=department_slots_per_token(moe),
                intermediate_size=moe.shared_intermediate_size,
                custom_routing_function=self._department_routing,
                prefix=f"{prefix}.departments",
                **common,
            )
            if moe.shared_intermediate_size
            else None
        )
        self.experts = (
            FusedMoEFactory(
                num_experts=moe.num_experts,
                top_k=moe.top_k,
                intermediate_size=moe.private_intermediate_size,
                custom_routing_function=self._expert_routing,
                prefix=f"{prefix}.experts",
                **common,
            )
            if moe.private_intermediate_size
            else None
        )
        self.shared_experts = (
            SharedExperts(moe, quant=config.quantization, dtype=dtype) if moe.has_shared_experts else None
        )

    def _routing(self, logits: torch.Tensor):
        return route_logits(logits, self.router.bias, self.moe)

    def _department_routing(self, hidden_states, gating_output, topk, renormalize):
        return department_slots(self._routing(gating_output), self.moe)

    def _expert_routing(self, hidden_states, gating_output, topk, renormalize):
        return expert_slots(self._routing(gating_output))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = router_logits(x, self.router.weight, self.router.logit_bias)
        out = torch.zeros_like(x)
        for part in (self.departments, self.experts):
            if part is not None:
                out = out + part(hidden_states=x, router_logits=logits)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x).to(x.dtype)
        return out


def dense_mlp(config: LMConfig) -> DenseMLP:
    """A dense block's MLP, its projections QuantizedLinears where quantized_linears has "dense"."""
    mlp = DenseMLP(config.hidden_size, config.dense_intermediate_size)
    if config.quantization is not None and "dense" in config.quantized_linears:
        for name in ("gate_proj", "up_proj", "down_proj"):
            linear = getattr(mlp, name)
            quantized = QuantizedLinear(
                linear.in_features, linear.out_features, config.quantization, bias=False, dtype=linear.weight.dtype
            )
            setattr(mlp, name, quantized)
    return mlp


class KernelFFN(DeaMoELayer):
    """One DeaMoE FFN on deamoe-trt's CPU kernel through the deamoe::cpu_ffn custom op
    (deamoe_trt.integrations.vllm.ffn_op): the layer's own tensors under the checkpoint's names,
    packed for the kernel at the first forward, after vLLM has loaded them."""

    def __init__(self, config: LMConfig):
        dtype = torch.get_default_dtype()
        super().__init__(
            config.moe,
            dtype=dtype,
            router_dtype=torch.float32 if config.float32_router else dtype,
            quant=config.quantization,
        )
        self._handle: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self._handle is None:
            from ...cpu import CpuDeaMoE

            self._handle = register_layer(CpuDeaMoE(self))
        return torch.ops.deamoe.cpu_ffn(x, self._handle)


def moe_ffn(config: LMConfig, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    """The DeaMoE FFN the measured choice (ffn_op.ffn_choice) names for this platform and model."""
    dtype = torch.get_default_dtype()
    choice = ffn_choice(cpu=current_platform.is_cpu(), dtype=dtype, quantized=config.quantization is not None)
    check_quantized_platform(config, *platform_name_and_amx(), dtype=dtype)  # the engine's dtype, known here
    return KernelFFN(config) if choice == "cpu-kernel" else DeaMoEFFN(config, vllm_config, prefix)


class DeaMoEBlock(nn.Module):
    def __init__(self, config: LMConfig, layer: int, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn: nn.Module = (
            DeaMoELatentAttention(config, vllm_config, f"{prefix}.self_attn")
            if config.is_mla
            else DeaMoEAttention(config, layer, vllm_config, f"{prefix}.self_attn")
        )
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = (
            dense_mlp(config) if config.is_dense(layer) else moe_ffn(config, vllm_config, f"{prefix}.mlp")
        )
        self.residual_multiplier = config.residual_multiplier

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self._scaled(self.self_attn(self.input_layernorm(x), cos, sin))
        return h + self._scaled(self.mlp(self.post_attention_layernorm(h)).to(h.dtype))

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        return branch if self.residual_multiplier == 1 else branch * self.residual_multiplier


class DeaMoEForCausalLM(nn.Module):
    """vLLM's model interface (embed_input_ids, forward, compute_logits, load_weights)."""

    # The checkpoint's q/k/v projections are one vLLM layer: compressed-tensors' "ignore" names them.
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = self.lm = _lm_config(vllm_config)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, prefix="embed_tokens")
        self.layers = nn.ModuleList(
            DeaMoEBlock(config, i, vllm_config, f"layers.{i}") for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, quant_config=vllm_config.quant_config, prefix="lm_head"
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, scale=1.0 / config.logits_scaling)
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos.to(self.norm.weight.device), persistent=False)
        self.register_buffer("rope_sin", sin.to(self.norm.weight.device), persistent=False)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x if self.lm.embedding_multiplier == 1 else x * self.lm.embedding_multiplier

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        # [T, 1, half]: broadcast over the heads of [T, heads, head_dim].
        cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        for block in self.layers:
            x = block(x, cos, sin)
        return self.norm(x)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        tensors = dict(weights)
        if any(isinstance(block.mlp, KernelFFN) for block in self.layers):
            # Kernel FFNs hold the checkpoint's own tensors: compressed-tensors' groups go back to them.
            groups = {name: t for name, t in tensors.items() if is_served_group(name)}
            tensors = {name: t for name, t in tensors.items() if name not in groups}
            tensors.update(checkpoint_state(groups, self.lm))
        embedding = tensors.get("embed_tokens.weight")
        stored = embedding.dtype if embedding is not None else torch.float32
        skeleton = DeaMoELM(self.lm, dtype=stored, device="meta")
        # The checkpoint reader's own check: every tensor present, shaped, typed and finite.
        as_stored = tensors if self.lm.quantization is None else checkpoint_state(tensors, self.lm)
        check_tensors(as_stored, expected_tensors(skeleton), dtype_name(stored), "model.safetensors")
        # Quantized shared experts and dense MLPs keep their codes and scales in buffers.
        params = {**dict(self.named_buffers()), **dict(self.named_parameters())}
        loaded: set[str] = set()

        def put(name: str, tensor: torch.Tensor) -> None:
            param = params[name]
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor.to(param.dtype))
            else:
                loader(param, tensor.to(param.dtype))
            loaded.add(name)

        for name, tensor in tensors.items():
            parts = name.split(".")
            if ".self_attn." in name and parts[3] in ("q_proj", "k_proj", "v_proj") and not self.lm.is_mla:
                target = ".".join([*parts[:3], "qkv_proj", parts[4]])
                qkv = params[target]
                qkv.weight_loader(qkv, tensor.to(qkv.dtype), parts[3][0])  # type: ignore[attr-defined]  # vLLM sets it
                loaded.add(target)
            elif len(parts) > 4 and parts[2] == "mlp" and parts[4].isdigit():  # compressed-tensors group
                self._load_compressed_group(name, tensor, params, loaded)
            elif name in params and ".mlp." in name:  # a KernelFFN's own tensors
                put(name, tensor)
            elif ".mlp.departments." in name or ".mlp.experts." in name:
                self._load_grouped(name, tensor, params, loaded)
            elif name.endswith(ROUTER_BIAS) or name.endswith("router.logit_bias"):
                put(name, tensor.float())
            else:
                put(name, tensor)
        return loaded

    def _load_grouped(self, name: str, tensor: torch.Tensor, params: dict, loaded: set[str]) -> None:
        """gate_up [G, 2f, d] (gate rows, then up) and down [G, d, f], and their biases
        gate_up_bias [G, 2f] and down_bias [G, d]: FusedMoE's w13 and w2, loaded group by group
        through its weight loader (which shards them for tensor and expert parallelism). With
        gpt-oss's activation vLLM wants gate and up rows interleaved (g0, u0, g1, ...), which
        its loader does not write: this rank's rows are interleaved here and copied in."""
        part, kind = name.rsplit(".", 2)[1:]
        prefix = name[: -len(f"{part}.{kind}")] + part
        stem = "w13" if kind.startswith("gate_up") else "w2"
        target = f"{prefix}.routed_experts.{stem}_{'bias' if kind.endswith('_bias') else 'weight'}"
        param = params[target]
        width = tensor.shape[1] // 2
        if stem == "w13" and self.lm.moe.activation == "swiglu_clamped":
            rows = param.shape[1] // 2
            start = get_tensor_model_parallel_rank() * rows
            gate, up = tensor[:, start : start + rows], tensor[:, width + start : width + start + rows]
            param.data.copy_(torch.stack((gate, up), dim=2).flatten(1, 2).to(param.dtype))
            loaded.add(target)
            return
        for group in range(tensor.shape[0]):
            weight = tensor[group].to(param.dtype)
            if kind.startswith("gate_up"):
                param.weight_loader(param, weight[:width], target, shard_id="w1", expert_id=group)
                param.weight_loader(param, weight[width:], target, shard_id="w3", expert_id=group)
            else:
                param.weight_loader(param, weight, target, shard_id="w2", expert_id=group)
        loaded.add(target)

    def _load_compressed_group(self, name: str, tensor: torch.Tensor, params: dict, loaded: set[str]) -> None:
        """layers.{i}.mlp.{part}.{g}.{gate|up|down}_proj.weight_{packed|scale|shape}: one group's
        projection in compressed-tensors' layout, into FusedMoE's w13/w2 parameters of vLLM's
        quantized method through its weight loader (which shards and checks it)."""
        layer, part, group, proj, suffix = name.split(".")[1], *name.split(".")[3:]
        stem = "w2" if proj == "down_proj" else "w13"
        target = f"layers.{layer}.mlp.{part}.routed_experts.{stem}_{suffix}"
        param = params[target]
        shard = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[proj]
        param.weight_loader(param, tensor, target, shard_id=shard, expert_id=int(group))
        loaded.add(target)
