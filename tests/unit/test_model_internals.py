"""The transformers internals ablate's speed paths patch or reproduce, pinned (as
tests/unit/test_trainer_private_api.py pins Trainer's): the attention functions packed attention calls
and registers, the mask preprocessing that passes a hand-built 4-D mask through, `_attn_implementation`,
`DynamicCache.reorder_cache` (GRPO's generator), the sampling warpers, and per model family the
RMSNorm / MLP forwards the lean layers reproduce op for op, the attention and model forwards the
packed batch's `unpad` travels through, and the causal LM forward the backbone/head split replaces.

Each is pinned by its parameters (where ablate calls it), one line of its source that states what
ablate relies on, and a hash of its whole source: a transformers upgrade that changes any of them
fails here, not as silently different numbers. To move on: read the new source, check the line and
`why` still hold, run the speed tests (tests/unit/test_dpo_speed_paths.py, test_grpo_share_prompt.py,
test_grpo_generation.py, test_lean_layers.py), then update the hash. The list is found by reading
ablate.speed and ablate.rollouts: a newly imported transformers internal fails until pinned here.
Recorded with transformers 5.24.0, the floor in pyproject.toml.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import ablate


class Pin(NamedTuple):
    params: tuple[str, ...] | None  # where ablate calls it: its parameter names (None: not called by ablate)
    line: str  # a line of its source: what ablate relies on
    sha: str  # sha256 of its (dedented) source, first 12 hex digits
    why: str  # where ablate depends on it


TF = "transformers."
PINNED: dict[str, Pin] = {
    "integrations.sdpa_attention.sdpa_attention_forward": Pin(
        (
            "module",
            "query",
            "key",
            "value",
            "attention_mask",
            "dropout",
            "scaling",
            "is_causal",
            "position_bias",
            "kwargs",
        ),
        "attn_output = torch.nn.functional.scaled_dot_product_attention(",
        "9be3d6b1f79a",
        "ablate.speed.packing.packed_sdpa runs it on the padded layout of a packed batch",
    ),
    "models.llama.modeling_llama.eager_attention_forward": Pin(
        ("module", "query", "key", "value", "attention_mask", "scaling", "dropout", "kwargs"),
        "attn_weights = attn_weights + attention_mask",
        "cb34ccea2871",
        "packed_sdpa runs it (with an additive mask) on CPU in bf16/fp16 for short rows",
    ),
    "masking_utils.sdpa_mask": Pin(
        None, "def sdpa_mask(", "a30991b130d8", "registered as the packed attention's mask function (sdpa's)"
    ),
    "masking_utils._preprocess_mask_arguments": Pin(
        None,
        "if isinstance(attention_mask, (torch.Tensor, BlockMask)) and len(attention_mask.shape) == 4:",
        "606823244fa4",
        "a 4-D mask is used as given: the hand-built layouts (pairs, groups, packing) rely on it",
    ),
    "masking_utils.AttentionMaskInterface.register": Pin(
        ("key", "value"),
        "def register(",
        "e39716f7d534",
        "packing registers the packed attention's mask function",
    ),
    "modeling_utils.AttentionInterface.register": Pin(
        ("key", "value"), "def register(", "e39716f7d534", "packing registers packed_sdpa under its own name"
    ),
    "modeling_utils.ALL_ATTENTION_FUNCTIONS.__getitem__": Pin(
        ("key",),
        "return self._global_mapping[key]",
        "5e2a67a46b33",
        "sequence parallelism wraps the model's own attention kernel, looked up by its name (ablate.speed.ulysses)",
    ),
    "masking_utils.ALL_MASK_ATTENTION_FUNCTIONS.__getitem__": Pin(
        ("key",),
        "return self._global_mapping[key]",
        "5e2a67a46b33",
        "sequence parallelism registers the model's own mask function under its wrapper's name (ablate.speed.ulysses)",
    ),
    "modeling_utils.PreTrainedModel.set_attn_implementation": Pin(
        ("self", "attn_implementation", "allow_all_kernels"),
        "def set_attn_implementation(",
        "0d62e738851b",
        "use_packed_attention switches a model to packed_sdpa",
    ),
    "configuration_utils.PreTrainedConfig._attn_implementation": Pin(
        None,
        "return self._attn_implementation_internal",
        "7e84402e207b",
        "the speed plan reads the attention kernel here; attention forwards look it up by this name",
    ),
    "cache_utils.DynamicCache.__init__": Pin(
        ("self", "ddp_cache_data", "config", "offloading", "offload_only_non_sliding"),
        "config",
        "3ef782f6a815",
        "SharedPromptGenerator builds DynamicCache(config=model.config)",
    ),
    "cache_utils.DynamicCache.reorder_cache": Pin(
        ("self", "beam_idx"),
        "self.layers[layer_idx].reorder_cache(beam_idx)",
        "ac9e0292e293",
        "SharedPromptGenerator copies each prompt's cache to its rows and drops ended rows with it",
    ),
    "cache_utils.DynamicLayer.reorder_cache": Pin(
        None,
        "self.keys = self.keys.index_select(0, beam_idx.to(self.keys.device))",
        "e0608465cc2b",
        "the per-layer reorder: rows selected, repeats allowed",
    ),
    "utils.get_json_schema": Pin(
        ("func",),
        "def get_json_schema(func: Callable) -> dict:",
        "31ce02069826",
        "ablate.rollouts.tool_calls: a tool's signature and docstring become its schema, as chat "
        "templates take them (TRL's GRPO tools do the same)",
    ),
    "generation.logits_process.TemperatureLogitsWarper.__call__": Pin(
        ("self", "input_ids", "scores"),
        "scores_processed = scores / self.temperature",
        "d3ca7666874e",
        "SharedPromptGenerator samples with generate's own warpers",
    ),
    "generation.logits_process.TopKLogitsWarper.__call__": Pin(
        ("self", "input_ids", "scores"),
        "indices_to_remove = scores < torch.topk(scores, top_k)[0][..., -1, None]",
        "3f901d10cbf2",
        "SharedPromptGenerator samples with generate's own warpers",
    ),
    "generation.logits_process.TopPLogitsWarper.__call__": Pin(
        ("self", "input_ids", "scores"),
        "sorted_logits, sorted_indices = torch.sort(scores, descending=False)",
        "66d37a2701b0",
        "SharedPromptGenerator samples with generate's own warpers",
    ),
    "generation.logits_process.LogitsProcessorList.__call__": Pin(
        ("self", "input_ids", "scores", "kwargs"),
        "scores = processor(input_ids, scores)",
        "9bc8e809ae87",
        "SharedPromptGenerator applies its warpers in generate's order",
    ),
}

# per model family (ablate.speed.split.PLAIN_HEAD_MODELS; lean.RMS_NORMS / GATED_MLPS by class name)
FAMILY_LINES = {
    "RMSNorm.__init__": ("self.variance_epsilon = eps", "lean RMSNorm reads weight and variance_epsilon"),
    "RMSNorm.forward": (
        "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)",
        "lean RMSNorm (ablate.speed.lean) reproduces it op for op: bitwise-equal outputs",
    ),
    "MLP.forward": (
        "down_proj = self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))",
        "lean MLP reproduces it (silu only), down_proj fused in when a plain bias-free Linear",
    ),
    "Attention.forward": (
        "attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(",
        "packed_sdpa is looked up by name; the packed batch's `unpad` reaches it in **kwargs",
    ),
    "Model.forward": (
        "hidden_states = decoder_layer(",
        "every layer gets the mask (a 4-D one as built) and **kwargs",
    ),
    "ForCausalLM.forward": (
        "logits = self.lm_head(hidden_states)",
        "the split (completion_only_logits): nothing between the backbone and lm_head",
    ),
}
FAMILY_SHA = {
    "Llama": ("b5e132fe182c", "d676bfe9af0e", "b4e9c2637c7f", "15034ca19bd8", "6ad906eadeb4", "7c3c3983abb9"),
    "Mistral": (
        "e27ca6cbeae7",
        "d676bfe9af0e",
        "b4e9c2637c7f",
        "4f9a18cc72b2",
        "0a953917a1d6",
        "ed35883a09a5",
    ),
    "Qwen2": ("c2c7d2f3097d", "d676bfe9af0e", "b4e9c2637c7f", "19fc6c09f70a", "4098825e5a45", "d57926925356"),
    "Qwen3": ("7979194c2030", "d676bfe9af0e", "b4e9c2637c7f", "fc750afd3f26", "4098825e5a45", "3917225085c9"),
}
FORWARD_PARAMS = (
    "self",
    "input_ids",
    "attention_mask",
    "position_ids",
    "cache",
    "inputs_embeds",
    "labels",
    "use_cache",
    "logits_to_keep",
    "kwargs",
)  # ForCausalLM.forward: logits_to_keep, **kwargs (unpad)
for _family, _shas in FAMILY_SHA.items():
    _module = f"models.{_family.lower()}.modeling_{_family.lower()}"
    for (_member, (_line, _why)), _sha in zip(FAMILY_LINES.items(), _shas):
        _params = FORWARD_PARAMS if _member == "ForCausalLM.forward" else None
        PINNED[f"{_module}.{_family}{_member}"] = Pin(_params, _line, _sha, _why)


def resolve(name: str) -> Any:
    """`transformers.<name>`: the longest importable module prefix, then attributes."""
    parts = (TF + name).split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj.fget if isinstance(obj, property) else obj
    raise ImportError(name)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_internal(name):
    pin = PINNED[name]
    obj = resolve(name)
    source = textwrap.dedent(inspect.getsource(obj))
    if pin.params is not None:
        assert tuple(inspect.signature(obj).parameters) == pin.params, (
            f"{name}{inspect.signature(obj)}: {pin.why}"
        )
    assert pin.line in source, f"{name} no longer has `{pin.line}`: {pin.why}"
    sha = hashlib.sha256(source.encode()).hexdigest()[:12]
    assert sha == pin.sha, (
        f"transformers changed {name} (sha {sha}): read it, check that {pin.why} still holds, "
        "run the speed tests, then update the pin"
    )


def _transformers_internals_imported() -> set[str]:
    """`from transformers.<module> import <name>` in ablate.speed and ablate.rollouts (the top-level
    `from transformers import X` is the public API, not pinned here)."""
    src = Path(ablate.__file__).resolve().parent
    found = set()
    for path in [*(src / "speed").glob("*.py"), *(src / "rollouts").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(TF):
                found |= {f"{node.module[len(TF) :]}.{alias.name}" for alias in node.names}
    return found


def test_every_imported_internal_is_pinned():
    """Each internal ablate's speed code imports is pinned itself or through its members."""
    unpinned = {
        n
        for n in _transformers_internals_imported()
        if not any(p == n or p.startswith(n + ".") for p in PINNED)
    }
    assert not unpinned, (
        f"ablate.speed/rollouts import transformers internals not pinned here: {sorted(unpinned)}"
    )


def test_lean_and_split_families_are_the_pinned_ones():
    """The lean layers find their modules by class name, the split and layouts by model_type: exactly the
    families pinned above."""
    from ablate.speed.lean import GATED_MLPS, RMS_NORMS
    from ablate.speed.split import PLAIN_HEAD_MODELS

    assert {f.lower() for f in FAMILY_SHA} == set(PLAIN_HEAD_MODELS)
    assert RMS_NORMS == {f"{f}RMSNorm" for f in FAMILY_SHA} and GATED_MLPS == {f"{f}MLP" for f in FAMILY_SHA}
