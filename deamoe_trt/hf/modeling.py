"""DeaMoEForCausalLM: the reference language model (deamoe_trt.lm.model.DeaMoELM) as a
transformers PreTrainedModel that generate() drives with transformers' caches.

The model holds a DeaMoELM under `model` and runs its forward, so its logits are the
reference's own: the FFNs are deamoe_trt.layer's DeaMoE layers, routed by
deamoe_trt.routing.route_logits. Its tensors carry Hugging Face's names: the LM checkpoint's
behind "model.", except the head, which is the top-level lm_head as in every transformers
causal LM (the DeaMoELM reaches it as a plain attribute, not a submodule).

The cache: transformers' Cache (a DynamicCache unless the caller passes one) stores every
block's keys and values (MLA: the compressed c_kv and rotated key part) in full, so its
length is the position and its get_seq_length() is what generate() expects; a sliding block
hides the keys outside its window by the mask alone. Each forward reads the stored tensors
(an update with no tokens returns them), runs the reference on them and appends the new
tokens' entries.

Batches are unpadded: an attention mask with a zero is refused, as the reference has no
padding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import MoeCausalLMOutputWithPast

from ..errors import UsageError
from ..lm.model import DeaMoELM, rope_tables
from ..routing import load_balance_loss
from .configuration import DeaMoEPretrainedConfig

# transformers 5 names the cache argument and output field `cache`, 4.x `past_key_values`.
_CACHE_FIELD = "cache" if "cache" in MoeCausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_TIED = {"lm_head.weight": "model.embed_tokens.weight"}


class DeaMoEPreTrainedModel(PreTrainedModel):
    config_class = DeaMoEPretrainedConfig
    base_model_prefix = "model"
    # transformers declares it an instance attribute (list or set) that it rewrites per model.
    _no_split_modules = ["Block"]  # noqa: RUF012
    _supports_cache_class = True

    def _init_weights(self, module: torch.nn.Module) -> None:
        # Only the rotary tables: derived from the config, never saved, and left unset when
        # transformers builds the model on the meta device. The weights keep their
        # constructors' initialization (DeaMoELM.random draws the reference's).
        if isinstance(module, DeaMoELM):
            cos, sin = rope_tables(module.config)
            with torch.no_grad():
                module.rope_cos.copy_(cos)
                module.rope_sin.copy_(sin)


class DeaMoEForCausalLM(DeaMoEPreTrainedModel, GenerationMixin):
    # transformers 5 maps each tied key to its source, 4.x lists them.
    _tied_weights_keys: Any = _TIED if int(transformers.__version__.split(".")[0]) >= 5 else list(_TIED)

    def __init__(self, config: DeaMoEPretrainedConfig):
        super().__init__(config)
        self.model = DeaMoELM(config.lm_config(), dtype=torch.get_default_dtype())
        self.lm_head = self.model._modules.pop("lm_head")
        object.__setattr__(self.model, "lm_head", self.lm_head)  # DeaMoELM.forward's head, not its submodule
        for block in self.model.layers:
            if hasattr(block.self_attn, "keep"):
                block.self_attn.keep = 0  # the cache keeps every key (see the module docstring)
        self.post_init()

    @classmethod
    def from_lm(cls, lm: DeaMoELM) -> DeaMoEForCausalLM:
        """A model sharing lm's tensors (a reference model wrapped for transformers)."""
        from .fields import hf_fields

        fields = hf_fields(lm.config)
        config = DeaMoEPretrainedConfig(**{k: v for k, v in fields.items() if k != "model_type"})
        model = cls(config).to(lm.dtype)
        state = {(k if k == "lm_head.weight" else "model." + k): v for k, v in lm.state_dict().items()}
        model.load_state_dict(state, assign=True)
        model.tie_weights_to_embedding()
        return model.eval()

    def tie_weights_to_embedding(self) -> None:
        """With tie_word_embeddings the head is the embedding matrix (one Parameter)."""
        if self.model.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        """transformers' from_pretrained, after a one-line refusal of a local directory whose
        tensors do not match its config.json (transformers would print a table and raise, or
        with ignore_mismatched_sizes initialize the mismatched tensors at random)."""
        directory = Path(str(pretrained_model_name_or_path))
        if (directory / "config.json").is_file():
            config = kwargs.get("config")
            if not isinstance(config, DeaMoEPretrainedConfig):
                config = DeaMoEPretrainedConfig.from_pretrained(directory)
            check_tensors(directory, config)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.lm_head = value
        object.__setattr__(self.model, "lm_head", value)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_router_logits: bool | None = None,
        **kwargs: Any,
    ) -> MoeCausalLMOutputWithPast:
        if input_ids is None or inputs_embeds is not None:
            raise UsageError("DeaMoEForCausalLM takes input_ids (inputs_embeds are not supported)")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise UsageError("DeaMoEForCausalLM takes unpadded batches: the attention mask must be all ones")
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = DynamicCache()
        tokens = input_ids.shape[1]
        past = None
        if cache is not None:
            empty = self.model.empty_cache(input_ids.shape[0])
            past = [cache.update(k, v, i) for i, (k, v) in enumerate(empty)]
        out = self.model(input_ids, past)
        if cache is not None:
            for i, (k, v) in enumerate(out.past_key_values):
                cache.update(k[:, :, -tokens:], v[:, :, -tokens:], i)
        logits = out.logits
        if isinstance(logits_to_keep, int) and logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            logits = logits[:, logits_to_keep]
        loss = None
        if labels is not None:
            shift_logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
            shift_labels = labels[:, 1:].reshape(-1).to(shift_logits.device)
            loss = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        aux_loss, router_scores = None, None
        if output_router_logits and out.routings:
            experts = self.model.config.moe.num_experts
            aux_loss = sum(load_balance_loss(r, experts) for r in out.routings) / len(out.routings)
            router_scores = tuple(r.scores for r in out.routings)
            if loss is not None:
                loss = loss + self.config.router_aux_loss_coef * aux_loss
        return MoeCausalLMOutputWithPast(
            loss=loss,
            aux_loss=aux_loss,
            logits=logits,
            router_logits=router_scores,
            **{_CACHE_FIELD: cache if use_cache else None},
        )


def check_tensors(directory: Path, config: DeaMoEPretrainedConfig) -> None:
    """A one-line UsageError unless directory's safetensors hold exactly the tensors, of the
    shapes, that config's model has (read from the headers; no weights are loaded)."""
    from safetensors import safe_open

    with torch.device("meta"):
        skeleton = DeaMoEForCausalLM(config)
    expected = {n: tuple(t.shape) for n, t in skeleton.state_dict().items()}
    if config.lm_config().tie_word_embeddings:
        expected.pop("lm_head.weight")
    found: dict[str, tuple[int, ...]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), "pt") as f:
            found.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})  # noqa: SIM118 - a safe_open handle is no dict
    if not found:
        return  # transformers says what is missing
    for name, shape in expected.items():
        if name not in found:
            raise UsageError(f"{directory} lacks the tensor {name} that its config.json implies; incomplete?")
        if found[name] != shape:
            raise UsageError(
                f"{directory}: {name} has shape {list(found[name])}, but config.json implies {list(shape)}; "
                "the config does not describe these weights"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise UsageError(f"{directory} has {len(extra)} tensor(s) its config.json does not describe, first {extra[0]}")
