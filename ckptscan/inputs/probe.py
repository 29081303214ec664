"""Probe files: fixed router inputs, so ckptscan can see how tokens are routed.

A probe is a safetensors file with one tensor per MoE layer,

    layers.{i}.router_input   [T, d]  float (F16/BF16/F32/F64)

the hidden states that reach layer i's router for T fixed tokens (d is the
router's input size), plus optionally `tokens` (the token ids, for the
record; ckptscan ignores it). Layer numbers are the checkpoint's
(`model.layers.{i}`). ckptscan applies every checkpoint's router to the same
probe, so differences in routing come from the weights alone.

`capture_probe` writes one from a user's own model in one call; `load_probe`
validates a file and reads one layer at a time during a scan (a probe for a
large model is gigabytes, and the scan needs one layer at a time).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from safetensors.torch import save as safetensors_bytes

from ckptscan.errors import CkptScanError
from ckptscan.system.output import write_output
from ckptscan.readers.safetensors import TensorEntry, read_header, read_tensor
from ckptscan.storage import RemotePath, as_path

PROBE_KEY = re.compile(r"^layers\.(\d+)\.router_input$")
OPTIONAL_KEYS = ("tokens",)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
# Routers are modules whose last name component is `gate` or `router`:
# Mixtral `block_sparse_moe.gate`, Qwen/OLMoE/DeepSeek `mlp.gate`, GPT-OSS
# `mlp.router`. Anchoring at a dot keeps out Qwen-MoE's `shared_expert_gate`
# (a 1-output gate of the shared expert, not a router).
ROUTER_PATTERN = r"(?:^|\.)(?:gate|router)$"
# The block index in a module name: `model.layers.3.…`, `transformer.h.3.…`, `blocks.3.…`.
LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)(?:\.|$)")


@dataclass(frozen=True)
class Probe:
    """A validated probe file; tensors stay on disk until a layer is needed."""

    path: Path | RemotePath
    entries: Mapping[int, TensorEntry]  # layer -> `layers.{i}.router_input`

    @property
    def layers(self) -> list[int]:
        return sorted(self.entries)

    def router_input(self, layer: int) -> torch.Tensor:
        """[T, d] router inputs of `layer`, in the stored dtype."""
        return read_tensor(self.entries[layer], probe_key(layer))

    def check_routers(
        self, routers: Mapping[int, tuple[str, tuple[int, ...]]], hidden_size: int, model_path: Any = None
    ) -> None:
        """Fail early, before any weight is read, if the probe cannot feed
        these routers: {layer: (router tensor name, its stored shape)}, each
        taking inputs of `hidden_size` (stored shapes may be stacked or flat)."""
        missing = sorted(set(routers) - set(self.entries))
        if missing:
            raise CkptScanError(
                f"the probe has no router input for MoE layer(s) {missing} of {model_path} "
                f"(it has layers {self.layers}); capture it from this model, or pass --layers",
                path=self.path,
            )
        for layer, (name, shape) in sorted(routers.items()):
            probe_shape = list(self.entries[layer].shape)
            if probe_shape[1] != hidden_size:
                raise CkptScanError(
                    f"layer {layer}: probe router input is {probe_shape} ([T, d]) but the router "
                    f"'{name}' {list(shape)} in {model_path} takes d = {hidden_size}; "
                    "was the probe captured from another model?",
                    path=self.path,
                    tensor=probe_key(layer),
                )


def probe_key(layer: int) -> str:
    return f"layers.{layer}.router_input"


def load_probe(path: str | Path | RemotePath) -> Probe:
    """Read and validate a probe file's header and values (one layer in memory
    at a time): a local file (`~` and $VARs expanded) or a URL, read by byte range."""
    path = as_path(path)
    if path.is_dir():
        raise CkptScanError("is a directory; a probe is one .safetensors file", path=path)
    entries, _ = read_header(path)
    layers: dict[int, TensorEntry] = {}
    unknown = []
    for name, entry in entries.items():
        match = PROBE_KEY.match(name)
        if match:
            layers[int(match.group(1))] = entry
        elif name not in OPTIONAL_KEYS:
            unknown.append(name)
    if unknown:
        raise CkptScanError(
            f"not a probe file: unexpected tensor(s) {sorted(unknown)[:5]}; a probe holds only "
            "'layers.{i}.router_input' [T, d] tensors (and optionally 'tokens')",
            path=path,
        )
    if not layers:
        raise CkptScanError("not a probe file: no 'layers.{i}.router_input' tensors", path=path)
    for layer, entry in sorted(layers.items()):
        _check_entry(path, probe_key(layer), entry)
    return Probe(path, layers)


def _check_entry(path: Path | RemotePath, name: str, entry: TensorEntry) -> None:
    if entry.dtype not in FLOAT_DTYPES:
        raise CkptScanError(f"dtype {entry.dtype}; router inputs must be one of {list(FLOAT_DTYPES)}",
                            path=path, tensor=name)
    if len(entry.shape) != 2 or entry.shape[0] < 1 or entry.shape[1] < 1:
        raise CkptScanError(f"shape {list(entry.shape)}; router inputs must be [T, d] with T, d ≥ 1",
                            path=path, tensor=name)
    values = read_tensor(entry, name)
    bad = ~torch.isfinite(values)
    if bool(bad.any()):
        first_token = int(bad.any(dim=1).nonzero()[0])
        raise CkptScanError(f"{int(bad.sum())} non-finite value(s) (NaN/Inf), first at token {first_token}",
                            path=path, tensor=name)


@torch.no_grad()
def capture_probe(
    model: torch.nn.Module,
    batch: Any,
    path: str | Path,
    pattern: str = ROUTER_PATTERN,
    token_mask: torch.Tensor | None = None,
) -> Probe:
    """Record the inputs of `model`'s routers on one batch and write a probe file.

    Routers are the submodules whose qualified name matches `pattern`
    (re.search); each must sit under a numbered block (`layers.N`, `h.N`,
    `blocks.N`), which becomes the probe's layer number. `batch` is passed as
    `model(**batch)` for a mapping, `model(*batch)` for a tuple or list,
    `model(batch)` otherwise. `token_mask` (bool, one entry per token, e.g.
    the attention mask [B, S]) drops padding. The model runs once in eval
    mode under no_grad (no router jitter, no dropout); each module's
    train/eval mode is restored afterwards. The file is written atomically.
    """
    regex = re.compile(pattern)
    routers: dict[int, str] = {}
    for name, _ in model.named_modules():
        if not name or not regex.search(name):
            continue
        match = LAYER_INDEX.search(name)
        if match is None:
            raise CkptScanError(f"router module '{name}' matches {pattern!r} but has no layer number "
                                "('layers.N', 'h.N' or 'blocks.N') in its name; pass a narrower pattern")
        layer = int(match.group(1))
        if layer in routers:
            raise CkptScanError(f"modules '{routers[layer]}' and '{name}' both match {pattern!r} in layer {layer}; "
                                "pass a pattern that matches one router per layer")
        routers[layer] = name
    if not routers:
        raise CkptScanError(f"no module name matches {pattern!r}; pass the pattern of the router modules "
                            "(see model.named_modules())")

    captured: dict[int, list[torch.Tensor]] = {layer: [] for layer in routers}
    modules = dict(model.named_modules())
    handles = []
    modes = {module: module.training for module in model.modules()}
    try:
        for layer, name in routers.items():
            handles.append(modules[name].register_forward_pre_hook(_recorder(captured[layer], name), with_kwargs=True))
        model.eval()
        if isinstance(batch, Mapping):
            model(**batch)
        elif isinstance(batch, (tuple, list)):
            model(*batch)
        else:
            model(batch)
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes.items():
            module.train(training)

    tensors = {}
    for layer, calls in sorted(captured.items()):
        if not calls:
            raise CkptScanError(f"router module '{routers[layer]}' was not called by the forward pass")
        tokens = [_select_tokens(x, token_mask, routers[layer]) for x in calls]
        tensors[probe_key(layer)] = torch.cat(tokens).contiguous()
    metadata = {"format": "pt", "ckptscan": "probe", "router_modules": json.dumps(routers)}
    write_output(path, safetensors_bytes(tensors, metadata=metadata))
    return load_probe(path)


def _recorder(store: list[torch.Tensor], name: str) -> Callable[[torch.nn.Module, tuple, dict], None]:
    def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if not inputs:
            raise CkptScanError(f"router module '{name}' was called without a tensor input")
        store.append(inputs[0].detach().to("cpu", torch.float32))

    return hook


def _select_tokens(x: torch.Tensor, token_mask: torch.Tensor | None, name: str) -> torch.Tensor:
    """[..., d] -> [T, d], keeping the tokens `token_mask` marks."""
    flat = x.reshape(-1, x.shape[-1])
    if token_mask is None:
        return flat
    keep = token_mask.reshape(-1).to("cpu", torch.bool)
    if keep.numel() != flat.shape[0]:
        raise CkptScanError(f"token_mask has {keep.numel()} entries but router '{name}' saw {flat.shape[0]} tokens")
    return flat[keep]
