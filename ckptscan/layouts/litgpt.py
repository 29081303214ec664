"""litgpt `lit_model.pth` (Lightning-AI/litgpt `litgpt/model.py`).

Attention per layer `{prefix}transformer.h.{i}.attn.`:
- litgpt >= 0.5: `qkv.weight` [(H + 2G)·d, D], blocked rows [Q(H·d) | K(G·d) |
  V(G·d)] (seen in files written by litgpt 0.5.13).
- older litgpt: `attn.weight`, the same rows interleaved per query group,
  G × [q·(H/G) | k | v]; litgpt still converts it on load
  (`CausalSelfAttention._load_from_state_dict` → `qkv_reassemble`). From
  source, not seen in a real file.
- with `norm_qk`: `norm_q.weight` / `norm_k.weight`, per head [d], or flat
  [H·d] / [G·d] when `norm_qk_type: olmo2`. litgpt's RMSNorm scales by
  (1 + w) for configs whose name contains "Gemma" (`Config.norm_class`).

Head counts come from `model_config.yaml` beside the weights (`n_head`,
`n_query_groups`, `head_size`), which stated_config turns into config.json
names, or from --model-config / --num-heads.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import (HeadOverrides, ModelLayout, as_mapping, config_entry, find_layers, matched_prefix,
                                   present)
from ckptscan.layouts.geometry import HeadHints, fused_geometry
from ckptscan.layouts.plan import QKTensors, attach_output, attention_layout, find_output
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()
LAYOUTS = {"qkv": "blocked", "attn": "grouped"}
LOOKED = "no model_config.yaml beside lit_model.pth"

_QKV = re.compile(r"(?P<prefix>.*?)transformer\.h\.(?P<layer>\d+)\.attn\.(?:qkv|attn)\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_QKV.fullmatch(k) for k in keys if ".attn." in k)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    layers = find_layers(keys, _QKV, path, "*transformer.h.N.attn.qkv.weight")
    first = layers[min(layers)]
    fused = LAYOUTS[first.rsplit(".", 2)[-2]]
    shape = ckpt.tensors.shape(first)
    if len(shape) != 2:
        raise CkptScanError(f"expected a 2-D fused QKV weight, not shape {list(shape)}", path=path, tensor=first)
    hints = HeadHints.gather(
        overrides,
        num_heads=config_entry(config, "num_attention_heads", "n_head"),
        num_kv_heads=config_entry(config, "num_key_value_heads", "n_query_groups"),
        head_dim=config_entry(config, "head_dim", "head_size"),
        path=path,
    )
    geometry = fused_geometry(hints, first, shape[0], shape[1], fused, path, looked=LOOKED)
    # litgpt's RMSNorm adds 1 to its weight for Gemma configs (Config.norm_class).
    litgpt = as_mapping(config)
    offset = 1.0 if "Gemma" in str(litgpt.get("name", "")) and litgpt.get("norm_class_name") == "RMSNorm" else 0.0
    qk = {}
    for layer, name in layers.items():
        attn = name[: name.index(".attn.") + len(".attn.")]
        qk[layer] = QKTensors(name, fused=fused, q_norm=present(keys, attn + "norm_q.weight"),
                              k_norm=present(keys, attn + "norm_k.weight"), gain_offset=offset,
                              input_norm=present(keys, attn.removesuffix("attn.") + "norm_1.weight"))
    # `transformer.wte`, `transformer.ln_f` and `lm_head` (a tied head is saved under both names).
    prefix = matched_prefix(_QKV, first)
    output, note = find_output(keys, (prefix + "lm_head.weight",), (prefix + "transformer.wte.weight",),
                               (prefix + "transformer.ln_f.weight",), gain_offset=offset)
    layout = attach_output(attention_layout("litgpt", geometry, qk, ckpt.tensors.shape, path), output, note,
                           ckpt.tensors.shape, path)
    if fused == "grouped":
        layout.notes.append("legacy attn.attn.weight: rows interleaved per query group (from litgpt's source, not "
                            "seen in a real file)")
    if any(q.q_norm or q.k_norm for q in qk.values()):
        layout.notes.append(f"QK-norm gains folded as {'1 + w (Gemma config)' if offset else 'w'}")
    return layout
