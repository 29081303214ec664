"""A tiny Mixtral (or Qwen3-MoE, or dense Llama): the same modules, parameter
names and config as Hugging Face.

The point of matching HF exactly is that ckptscan reads these checkpoints with
the same code path it uses for real Mixtral checkpoints, and that
`MixtralForCausalLM.from_pretrained` can load them. Names follow
transformers' `modeling_mixtral.py` (v4 on-disk layout):
    model.embed_tokens, model.layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj,
    post_attention_layernorm, block_sparse_moe.gate, block_sparse_moe.experts.{e}.{w1,w2,w3}},
    model.norm, lm_head
`arch="qwen3_moe"` follows `modeling_qwen3_moe.py`: per-head RMSNorm on q and k
before RoPE (self_attn.{q,k}_norm [head_dim]) and the MoE as
mlp.gate / mlp.experts.{e}.{gate,up,down}_proj with norm_topk_prob.
`arch="llama"` follows `modeling_llama.py`: a dense mlp.{gate,up,down}_proj.
`arch="qwen3"` follows `modeling_qwen3.py`: Llama's dense MLP with Qwen3's QK-norm.
The class names stay Mixtral's; the arch only changes modules and names.
"""

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from experiments.attention import DRounding, attention, largest_causal_logit


@dataclass
class MixtralConfig:
    vocab_size: int = 256  # bytes
    hidden_size: int = 64
    intermediate_size: int = 16  # per expert
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    max_position_embeddings: int = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    router_aux_loss_coef: float = 0.02
    tie_word_embeddings: bool = True
    arch: str = "mixtral"  # "mixtral" | "qwen3_moe" | "llama" | "qwen3" (dense; intermediate_size is the MLP's)

    @property
    def qk_norm(self) -> bool:
        return self.arch in ("qwen3_moe", "qwen3")

    @property
    def dense(self) -> bool:
        return self.arch in ("llama", "qwen3")

    def to_hf(self, torch_dtype: str) -> dict:
        """config.json as transformers' config class of `arch` would write it."""
        fields = asdict(self)
        del fields["arch"]
        if self.arch == "qwen3_moe":
            experts = fields.pop("num_local_experts")
            fields.update(num_experts=experts, moe_intermediate_size=self.intermediate_size, norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], attention_bias=False)
        elif self.dense:
            for key in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"):
                del fields[key]
            fields.update(attention_bias=False, mlp_bias=False)
        name = {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe", "llama": "Llama", "qwen3": "Qwen3"}[self.arch]
        return {
            "architectures": [f"{name}ForCausalLM"],
            "model_type": self.arch,
            **fields,
            "attention_dropout": 0.0,
            "hidden_act": "silu",
            "bos_token_id": None,
            "eos_token_id": None,
            "output_router_logits": False,
            "router_jitter_noise": 0.0,
            "sliding_window": None,
            "torch_dtype": torch_dtype,
            "use_cache": True,
        }


class MixtralRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rope_cos_sin(cfg: MixtralConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF rotate-half RoPE tables, shape [T, head_dim]."""
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class MixtralAttention(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.cfg = cfg
        h, g, r, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.hidden_size
        self.q_proj = nn.Linear(d, h * r, bias=False)
        self.k_proj = nn.Linear(d, g * r, bias=False)
        self.v_proj = nn.Linear(d, g * r, bias=False)
        self.o_proj = nn.Linear(h * r, d, bias=False)
        if cfg.qk_norm:
            # Qwen3's QK-norm: RMSNorm over each head's dim, one gain [head_dim] shared by the heads.
            self.q_norm = MixtralRMSNorm(r, cfg.rms_norm_eps)
            self.k_norm = MixtralRMSNorm(r, cfg.rms_norm_eps)
        # Set by the trainer on the layers that get the flash-attention fault.
        self.d_rounding: DRounding | None = None
        self.max_logit = 0.0

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        cfg = self.cfg
        h, g, r = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = self.q_proj(x).view(b, t, h, r).transpose(1, 2)
        k = self.k_proj(x).view(b, t, g, r).transpose(1, 2)
        v = self.v_proj(x).view(b, t, g, r).transpose(1, 2)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA as in HF repeat_kv: query head i reads KV head i // (h // g).
        k = k.repeat_interleave(h // g, dim=1)
        v = v.repeat_interleave(h // g, dim=1)
        o = attention(q, k, v, r ** -0.5, self.d_rounding)
        # The inside view no checkpoint keeps: the largest attention logit of
        # this batch (the trainer logs it as the truth of when softmax saturated).
        with torch.no_grad():
            self.max_logit = largest_causal_logit(q, k, r ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, h * r))


class MixtralBlockSparseTop2MLP(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.w2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.w3 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaMLP(nn.Module):
    """SwiGLU MLP with Llama's names (also a Qwen3-MoE expert)."""

    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MixtralSparseMoeBlock(nn.Module):
    """Token-choice top-k: softmax over all experts, keep top-k, renormalise
    (Mixtral always; Qwen3-MoE with norm_topk_prob, as here)."""

    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=False)
        expert = LlamaMLP if cfg.arch == "qwen3_moe" else MixtralBlockSparseTop2MLP
        self.experts = nn.ModuleList(expert(cfg) for _ in range(cfg.num_local_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        router_logits = self.gate(x)
        probs = router_logits.float().softmax(dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
        return out.view(shape), router_logits


class MixtralDecoderLayer(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.cfg_arch = cfg.arch
        self.input_layernorm = MixtralRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = MixtralAttention(cfg)
        self.post_attention_layernorm = MixtralRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if cfg.arch == "mixtral":
            self.block_sparse_moe = MixtralSparseMoeBlock(cfg)
        else:
            self.mlp = MixtralSparseMoeBlock(cfg) if cfg.arch == "qwen3_moe" else LlamaMLP(cfg)

    def forward(self, x, cos, sin) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """Residual stream, router logits (None for a dense MLP), router input."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        router_input = self.post_attention_layernorm(x)
        ffn = self.block_sparse_moe if self.cfg_arch == "mixtral" else self.mlp
        if isinstance(ffn, MixtralSparseMoeBlock):
            out, router_logits = ffn(router_input)
        else:
            out, router_logits = ffn(router_input), None
        return x + out, router_logits, router_input


class MixtralModel(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(MixtralDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = MixtralRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MixtralForCausalLM(nn.Module):
    def __init__(self, cfg: MixtralConfig):
        super().__init__()
        self.cfg = cfg
        self.model = MixtralModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.apply(self._init_weights)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def _init_weights(self, module: nn.Module) -> None:
        # HF's _init_weights for Mixtral: N(0, initializer_range), norms at 1.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.cfg.initializer_range)

    def forward(self, idx: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Logits [B, T, V], router logits per layer, router inputs per layer."""
        cos, sin = rope_cos_sin(self.cfg, idx.shape[1])
        x = self.model.embed_tokens(idx)
        router_logits, router_inputs = [], []
        for layer in self.model.layers:
            x, logits, r_in = layer(x, cos, sin)
            if logits is not None:
                router_logits.append(logits)
            router_inputs.append(r_in)
        return self.lm_head(self.model.norm(x)), router_logits, router_inputs


def load_balancing_loss(router_logits: list[torch.Tensor], num_experts: int, top_k: int) -> torch.Tensor:
    """Switch/Mixtral auxiliary loss, as transformers' load_balancing_loss_func:
    E * sum_e (fraction of top-k slots routed to e) * (mean router prob of e)."""
    logits = torch.cat(router_logits, dim=0)
    probs = logits.float().softmax(dim=-1)
    _, chosen = probs.topk(top_k, dim=-1)
    slots = F.one_hot(chosen, num_experts).float()  # [N, k, E]
    tokens_per_expert = slots.mean(dim=0)  # [k, E]
    prob_per_expert = probs.mean(dim=0)  # [E]
    return num_experts * (tokens_per_expert * prob_per_expert).sum()


def hf_state_dict(model: MixtralForCausalLM, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors HF save_pretrained writes: tied lm_head is dropped, as HF does."""
    sd = model.state_dict()
    if model.cfg.tie_word_embeddings:
        del sd["lm_head.weight"]
    return {k: v.detach().to(dtype).contiguous() for k, v in sd.items()}


def num_params(model: MixtralForCausalLM) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() de-duplicates tied weights

