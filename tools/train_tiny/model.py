"""DeepSeek-V3 in PyTorch, following docs/design/deepseek_v3_forward.md exactly.

Parameter names equal the published checkpoint's tensor names (module paths mirror them), so
export is `state_dict()` plus copies of the shared MTP embedding/head. Shapes use T tokens
(one sequence per call, or [B, T] batches), D hidden, H heads.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def acc(x):
    """The accumulation dtype: float32, or float64 when the model runs in float64."""
    return x if x.dtype == torch.float64 else x.float()


def rms_norm(x, w, eps):
    xa = acc(x)
    return (xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)) * w.to(xa.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps).to(x.dtype)


def rope_interleaved(x, positions, theta):
    """x: [..., T, Dr] with T matching positions [T]; rotates pairs (2i, 2i+1)."""
    dr = x.shape[-1]
    i = torch.arange(dr // 2, dtype=torch.float64, device=x.device)
    freqs = theta ** (-2.0 * i / dr)                                      # [Dr/2]
    ang = positions.to(torch.float64)[:, None] * freqs[None, :]           # [T, Dr/2]
    cos = torch.cos(ang).to(x.dtype)
    sin = torch.sin(ang).to(x.dtype)
    a = x[..., 0::2]
    b = x[..., 1::2]
    ra = a * cos - b * sin
    rb = b * cos + a * sin
    return torch.stack([ra, rb], dim=-1).flatten(-2)


class MLP(nn.Module):
    def __init__(self, d, inter):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, h = c["hidden_size"], c["num_attention_heads"]
        self.h = h
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvr = c["kv_lora_rank"]
        eps = c["rms_norm_eps"]
        self.q_a_proj = nn.Linear(d, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], eps)
        self.q_b_proj = nn.Linear(c["q_lora_rank"], h * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, self.kvr + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kvr, eps)
        self.kv_b_proj = nn.Linear(self.kvr, h * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(h * self.dv, d, bias=False)
        self.scale = (self.dn + self.dr) ** -0.5

    def forward(self, x, positions):
        """x: [B, T, D]; positions: [T] (rope positions of the rows)."""
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, self.h, -1)
        q = q.transpose(1, 2)                                           # [B, H, T, Dn+Dr]
        q_nope, q_pe = q[..., :self.dn], q[..., self.dn:]
        kv_a = self.kv_a_proj_with_mqa(x)                               # [B, T, C+Dr]
        c_lat = self.kv_a_layernorm(kv_a[..., :self.kvr])
        k_pe = kv_a[..., self.kvr:].unsqueeze(1)                        # [B, 1, T, Dr]
        kv = self.kv_b_proj(c_lat).view(b, t, self.h, -1).transpose(1, 2)
        k_nope, v = kv[..., :self.dn], kv[..., self.dn:]                # [B, H, T, Dn|Dv]
        theta = self.c["rope_theta"]
        q_pe = rope_interleaved(q_pe, positions, theta)
        k_pe = rope_interleaved(k_pe, positions, theta)
        scores = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * self.scale
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        p = torch.softmax(acc(scores), dim=-1).to(v.dtype)
        o = (p @ v).transpose(1, 2).reshape(b, t, self.h * self.dv)
        return self.o_proj(o)

    def qkv(self, x, positions):
        """x: [B, T, D] rows at rope positions [T] -> (q_nope, q_pe, k_nope, k_pe, v), each
        [B, H, T, Dn|Dr|Dv] (k_pe broadcast over heads as [B, 1, T, Dr])."""
        b, t, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(b, t, self.h, -1)
        q = q.transpose(1, 2)
        kv_a = self.kv_a_proj_with_mqa(x)
        c_lat = self.kv_a_layernorm(kv_a[..., :self.kvr])
        k_pe = kv_a[..., self.kvr:].unsqueeze(1)
        kv = self.kv_b_proj(c_lat).view(b, t, self.h, -1).transpose(1, 2)
        theta = self.c["rope_theta"]
        return (q[..., :self.dn], rope_interleaved(q[..., self.dn:], positions, theta),
                kv[..., :self.dn], rope_interleaved(k_pe, positions, theta), kv[..., self.dn:])

    def forward_chain(self, x_past, x_chain, q_pos):
        """The attention of chained draft rows, as speculative decoding runs them.

        x_past: [B, S, D] the layer's teacher-forced rows at positions 0..S-1 (their keys and
        values only). x_chain: [B, Q, D] chained rows at positions q_pos [Q] (each in 1..S);
        row j attends the past rows 0..q_pos[j]-1 and itself (its own key takes the place of
        the past row at q_pos[j]). Returns [B, Q, D]."""
        b, q_len, _ = x_chain.shape
        s_len = x_past.shape[1]
        dev = x_chain.device
        _, _, k_nope, k_pe, v = self.qkv(x_past, torch.arange(s_len, device=dev))
        q_nope, q_pe, ks_nope, ks_pe, vs = self.qkv(x_chain, q_pos)
        past = (q_nope @ k_nope.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * self.scale
        mask = torch.arange(s_len, device=dev)[None, :] >= q_pos[:, None]      # [Q, S]
        past = past.masked_fill(mask, float("-inf"))                            # [B, H, Q, S]
        own = ((q_nope * ks_nope).sum(-1) + (q_pe * ks_pe).sum(-1)) * self.scale  # [B, H, Q]
        p = torch.softmax(acc(torch.cat([past, own[..., None]], dim=-1)), dim=-1).to(v.dtype)
        o = p[..., :s_len] @ v + p[..., s_len:] * vs                            # [B, H, Q, Dv]
        return self.o_proj(o.transpose(1, 2).reshape(b, q_len, self.h * self.dv))


class Gate(nn.Module):
    def __init__(self, c):
        super().__init__()
        e = c["n_routed_experts"]
        self.weight = nn.Parameter(torch.empty(e, c["hidden_size"]))
        # Updated by the aux-loss-free rule, not by gradients; F32 in the checkpoint.
        self.register_buffer("e_score_correction_bias", torch.zeros(e, dtype=torch.float32))


def select_experts(scores, bias, n_group, topk_group, top_k):
    """noaux_tc selection. scores: [N, E] sigmoid scores; returns chosen ids [N, k] in
    descending order of biased score. Ties break to the lower index (torch.topk does not
    promise that; a stable descending sort does)."""
    n, e = scores.shape
    b = acc(scores) + bias.to(acc(scores).dtype)[None, :]                          # [N, E]
    grp = b.view(n, n_group, e // n_group)
    top2 = torch.sort(grp, dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
    gorder = torch.sort(top2, dim=-1, descending=True, stable=True).indices[:, :topk_group]
    gmask = torch.zeros(n, n_group, dtype=torch.bool, device=scores.device)
    gmask.scatter_(1, gorder, True)
    emask = gmask[:, :, None].expand(n, n_group, e // n_group).reshape(n, e)
    b = b.masked_fill(~emask, float("-inf"))
    return torch.sort(b, dim=-1, descending=True, stable=True).indices[:, :top_k]


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, inter = c["hidden_size"], c["moe_intermediate_size"]
        self.gate = Gate(c)
        self.experts = nn.ModuleList(MLP(d, inter) for _ in range(c["n_routed_experts"]))
        self.shared_experts = MLP(d, inter * c["n_shared_experts"])
        self.last_topk = None      # [N, k] chosen experts of the last call (for stats/bias)

    def forward(self, x):
        shape = x.shape
        xf = x.reshape(-1, shape[-1])                                    # [N, D]
        c = self.c
        logits = acc(xf) @ acc(self.gate.weight).t()               # [N, E]
        s = torch.sigmoid(logits)
        with torch.no_grad():
            topk = select_experts(s.detach(), self.gate.e_score_correction_bias,
                                  c["n_group"], c["topk_group"], c["num_experts_per_tok"])
        self.last_topk = topk
        w = s.gather(1, topk)                                            # [N, k] unbiased
        if c["norm_topk_prob"] and topk.shape[1] > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = (w * c["routed_scaling_factor"]).to(x.dtype)
        out = self.shared_experts(xf)
        flat_e = topk.reshape(-1)
        flat_tok = torch.arange(xf.shape[0], device=x.device).repeat_interleave(topk.shape[1])
        flat_w = w.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=len(self.experts)).tolist()
        start = 0
        routed = torch.zeros_like(xf)
        for ei, cnt in enumerate(counts):
            if cnt == 0:
                continue
            idx = order[start:start + cnt]
            start += cnt
            toks = flat_tok[idx]
            y = self.experts[ei](xf[toks]) * flat_w[idx, None]
            routed = routed.index_add(0, toks, y)
        return (out + routed).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, c, layer_idx):
        super().__init__()
        eps = c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = Attention(c)
        if layer_idx < c["first_k_dense_replace"]:
            self.mlp = MLP(c["hidden_size"], c["intermediate_size"])
        else:
            self.mlp = MoE(c)

    def forward(self, x, positions):
        h = x + self.self_attn(self.input_layernorm(x), positions)
        return h + self.mlp(self.post_attention_layernorm(h))


class SharedHead(nn.Module):
    """MTP head norm; the head matrix itself is tied to lm_head during training."""
    def __init__(self, c):
        super().__init__()
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MTPLayer(DecoderLayer):
    def __init__(self, c, layer_idx):
        super().__init__(c, layer_idx)
        d, eps = c["hidden_size"], c["rms_norm_eps"]
        self.enorm = RMSNorm(d, eps)
        self.hnorm = RMSNorm(d, eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.shared_head = SharedHead(c)


def mtp_input(m, emb, hidden):
    """The rows of MTP layer m (an MTPLayer) from (hidden, token) pairs: eh_proj([enorm(emb),
    hnorm(hidden)]). emb: [B, R, D] embeddings of the rows' tokens; hidden: [B, R, D]."""
    return m.eh_proj(torch.cat([m.enorm(emb), m.hnorm(hidden)], dim=-1))


def mtp_chain_forward(m, x_past, x_chain, q_pos):
    """Decoder layer m over chained rows x_chain [B, Q, D] at positions q_pos [Q] with the
    layer's teacher-forced rows x_past [B, S, D] (positions 0..S-1) as attention context.
    Returns the residual output [B, Q, D] (before shared_head.norm)."""
    h = x_chain + m.self_attn.forward_chain(m.input_layernorm(x_past),
                                            m.input_layernorm(x_chain), q_pos)
    return h + m.mlp(m.post_attention_layernorm(h))


class Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        n = c["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        layers = [DecoderLayer(c, i) for i in range(n)]
        layers += [MTPLayer(c, n + k) for k in range(c["num_nextn_predict_layers"])]
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class DeepseekV3(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Inner(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = self.c["initializer_range"]
        g = torch.Generator().manual_seed(self.c.get("_init_seed", 0))
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def moe_layers(self):
        return [(i, l.mlp) for i, l in enumerate(self.model.layers) if isinstance(l.mlp, MoE)]

    def forward(self, ids, mtp=True):
        """ids: [B, T]. Returns (logits [B, T, V], mtp_logits [B, T-1, V] or None).

        mtp_logits[:, t] predicts token t+2 from the main hidden at t and token t+1, with the
        MTP layer at rope position t.
        """
        c = self.c
        n = c["num_hidden_layers"]
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device)
        emb = self.model.embed_tokens(ids)                               # [B, T, D]
        h = emb
        for i in range(n):
            h = self.model.layers[i](h, pos)
        hmain = self.model.norm(h)                                       # [B, T, D]
        logits = self.lm_head(hmain)
        if not mtp or c["num_nextn_predict_layers"] == 0 or t < 2:
            return logits, None
        m = self.model.layers[n]
        e = m.enorm(emb[:, 1:])                                          # [B, T-1, D]
        g = m.hnorm(hmain[:, :-1])
        x = m.eh_proj(torch.cat([e, g], dim=-1))
        x = m(x, pos[:-1])
        mtp_logits = self.lm_head(m.shared_head.norm(x))
        return logits, mtp_logits

    def main_hidden(self, ids):
        """ids: [B, T] -> (emb [B, T, D], final-normed hidden [B, T, D], logits [B, T, V])."""
        pos = torch.arange(ids.shape[1], device=ids.device)
        emb = self.model.embed_tokens(ids)
        h = emb
        for i in range(self.c["num_hidden_layers"]):
            h = self.model.layers[i](h, pos)
        hmain = self.model.norm(h)
        return emb, hmain, self.lm_head(hmain)

    def mtp_layer(self, k):
        """MTP layer k (0-based) of the checkpoint."""
        return self.model.layers[self.c["num_hidden_layers"] + k]

    def mtp_head(self, k, residual):
        """Logits [.., V] of MTP layer k's residual output [.., D]."""
        return self.lm_head(self.mtp_layer(k).shared_head.norm(residual))

    def draft1_residual(self, emb, hmain):
        """MTP layer 0's teacher-forced rows: row t (position t) = (hmain[t], token t+1), which
        predicts token t+2. emb, hmain: [B, T, D] -> residual output [B, T-1, D]."""
        m = self.mtp_layer(0)
        pos = torch.arange(emb.shape[1] - 1, device=emb.device)
        return m(mtp_input(m, emb[:, 1:], hmain[:, :-1]), pos)

    def draft2_residual(self, k, emb, hmain, g1, rows=None):
        """Draft 2 chained as speculative decoding runs it (model/speculative_decode.h), in MTP
        layer k (k = 0: layer 0 reused). Row t sits at position t+1 and is (g1[t], token t+2),
        g1 = draft1_residual (the residual output before shared_head.norm); it attends layer
        k's teacher-forced rows (hmain[s], token s+1) at positions s = 0..t, and predicts token
        t+3. emb, hmain: [B, T, D]; g1: [B, T-1, D] -> residual output [B, T-2, D], or
        [B, R, D] for only the rows t in `rows` [R] (each in 0..T-3) when given."""
        m = self.mtp_layer(k)
        if rows is None:
            rows = torch.arange(emb.shape[1] - 2, device=emb.device)
        x_past = mtp_input(m, emb[:, 1:], hmain[:, :-1])                 # [B, T-1, D]
        x_chain = mtp_input(m, emb[:, rows + 2], g1[:, rows])            # [B, R, D]
        return mtp_chain_forward(m, x_past, x_chain, rows + 1)

    def forward_drafts(self, ids, k2):
        """ids: [B, T] -> (main logits [B, T, V], draft-1 logits [B, T-1, V] (row t predicts
        token t+2), draft-2 logits [B, T-2, V] (row t predicts token t+3, MTP layer k2))."""
        emb, hmain, logits = self.main_hidden(ids)
        g1 = self.draft1_residual(emb, hmain)
        g2 = self.draft2_residual(k2, emb, hmain, g1)
        return logits, self.mtp_head(0, g1), self.mtp_head(k2, g2)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())


def default_config():
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 4096,
        "hidden_size": 256,
        "intermediate_size": 768,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 16,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 64,
        "q_lora_rank": 128,
        "qk_rope_head_dim": 32,
        "v_head_dim": 32,
        "qk_nope_head_dim": 32,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "use_cache": True,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 1,
        "torch_dtype": "bfloat16",
    }
