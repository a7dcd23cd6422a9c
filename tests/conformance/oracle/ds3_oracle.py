#!/usr/bin/python3
"""Float64 reference forward pass of DeepSeek-V3 checkpoints (the conformance oracle), and of
the other members of that module family: Kimi K2 (model_type kimi_k2, DeepSeek-V3's
computation) and DeepSeek-V2 / V2-Lite (model_type deepseek_v2).

Implements docs/design/deepseek_v3_forward.md plainly, in float64 with numpy: full
recompute (no KV cache), the expanded (not absorbed) MLA, noaux_tc / greedy /
group_limited_greedy gating, YaRN, and the MTP layer. It shares no code with the engine:
it has its own safetensors reader, its own FP8/BF16 decoding and its own config parsing.

DeepSeek-V2 as DeepSeek's own modeling_deepseek.py (DeepseekV2ForCausalLM) computes it:
MoEGate takes softmax scores, greedy or group_limited_greedy top-k (a group ranks by its
best score), no correction bias, and then EITHER normalises the top-k weights (norm_topk_prob
with top_k > 1) OR multiplies them by routed_scaling_factor, never both; its YaRN is
DeepSeek-V3's (cos/sin × mscale(mscale) / mscale(mscale_all_dim), softmax scale ×
mscale(mscale_all_dim)^2). Absent fields take DeepseekV2Config's defaults (softmax, greedy,
norm_topk_prob false).

Shapes: T tokens, H heads, D hidden, Dn/Dr/Dv head dims, C kv_lora_rank, E routed experts.

CLI:
  ds3_oracle.py --model DIR --ids 1,2,3 [--out PREFIX]
writes PREFIX.logits.f64 (little-endian float64 [T, vocab]), PREFIX.mtp.f64 ([T-1, vocab])
and PREFIX.routing.json; without --out it prints everything as JSON on stdout.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

# ----------------------------------------------------------------------------------------
# Number formats
# ----------------------------------------------------------------------------------------


def fp8_e4m3fn_value(byte):
    """Exact value of one float8 e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits.
    No infinities; exponent 15 with mantissa 7 is NaN; exponent 0 is subnormal (m/8 * 2^-6)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp = (byte >> 3) & 0xF
    man = byte & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * (man / 8.0) * 2.0**-6
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


FP8_E4M3FN_TABLE = np.array([fp8_e4m3fn_value(b) for b in range(256)], dtype=np.float64)

DTYPE_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "I8": 1}


def decode_tensor(dtype, raw, shape):
    """raw: uint8 array of the tensor's bytes -> float64 array of `shape`."""
    if dtype == "F64":
        values = raw.view("<f8")
    elif dtype == "F32":
        values = raw.view("<f4")
    elif dtype == "F16":
        values = raw.view("<f2")
    elif dtype == "BF16":
        values = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype == "F8_E4M3":
        values = FP8_E4M3FN_TABLE[raw]
    elif dtype == "I8":
        values = raw.view(np.int8)
    else:
        raise ValueError(f"unknown dtype {dtype}")
    return values.astype(np.float64).reshape(shape)


def dequantize_blocks(weight, scale_inv, block_rows, block_cols):
    """weight [R, C] (fp8 values), scale_inv [ceil(R/br), ceil(C/bc)]:
    out[r, c] = weight[r, c] * scale_inv[r // br, c // bc] (edge blocks partial)."""
    rows, cols = weight.shape
    want = (-(-rows // block_rows), -(-cols // block_cols))
    if scale_inv.shape != want:
        raise ValueError(f"scale_inv shape {scale_inv.shape}, expected {want}")
    expanded = np.repeat(np.repeat(scale_inv, block_rows, axis=0), block_cols, axis=1)
    return weight * expanded[:rows, :cols]


# ----------------------------------------------------------------------------------------
# Safetensors
# ----------------------------------------------------------------------------------------


class SafetensorsFile:
    """One .safetensors file: 8-byte little-endian header length, JSON header, raw data."""

    def __init__(self, path):
        self.path = path
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        if self.data.size < 8:
            raise ValueError(f"{path}: truncated (no header length)")
        header_len = int(self.data[:8].view("<u8")[0])
        if 8 + header_len > self.data.size:
            raise ValueError(f"{path}: header length {header_len} beyond file end")
        header = json.loads(bytes(self.data[8 : 8 + header_len]).decode("utf-8"))
        header.pop("__metadata__", None)
        self.base = 8 + header_len
        self.entries = header  # name -> {"dtype", "shape", "data_offsets"}
        for name, e in header.items():
            begin, end = e["data_offsets"]
            count = int(np.prod(e["shape"], dtype=np.int64))
            if e["dtype"] not in DTYPE_BYTES:
                raise ValueError(f"{path}: {name}: unknown dtype {e['dtype']}")
            if end - begin != count * DTYPE_BYTES[e["dtype"]]:
                raise ValueError(f"{path}: {name}: {end - begin} bytes for shape {e['shape']}")
            if self.base + end > self.data.size:
                raise ValueError(f"{path}: {name}: data beyond file end")

    def read(self, name):
        e = self.entries[name]
        begin, end = e["data_offsets"]
        raw = np.array(self.data[self.base + begin : self.base + end])
        return decode_tensor(e["dtype"], raw, tuple(e["shape"])), e["dtype"]


class Checkpoint:
    """All tensors of a model directory (model.safetensors, or shards listed in
    model.safetensors.index.json), decoded to float64; FP8 weights dequantized."""

    def __init__(self, model_dir, block_rows=128, block_cols=128):
        self.block = (block_rows, block_cols)
        index_path = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index_path):
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(p for p in os.listdir(model_dir) if p.endswith(".safetensors"))
            weight_map = None
        self.files = {p: SafetensorsFile(os.path.join(model_dir, p)) for p in files}
        self.where = {}
        for p, st in self.files.items():
            for name in st.entries:
                if weight_map is not None and weight_map.get(name) != p:
                    raise ValueError(f"{p}: tensor {name} not listed for this shard in the index")
                self.where[name] = st
        if weight_map is not None:
            missing = [n for n in weight_map if n not in self.where]
            if missing:
                raise ValueError(f"index lists tensors absent from the shards: {missing[:5]}")

    def has(self, name):
        return name in self.where

    def get_int8(self, name):
        """A W8A8 weight (compressed-tensors: `name` I8 [out, in], `name`_scale [out, 1]) ->
        (int64 weights, float32 per-row scales), or None when `name` is not I8."""
        if name not in self.where or self.where[name].entries[name]["dtype"] != "I8":
            return None
        q, _ = self.where[name].read(name)
        scale, _ = self.where[name + "_scale"].read(name + "_scale")
        return q.astype(np.int64), scale.reshape(-1).astype(np.float32)

    def get(self, name):
        if name not in self.where:
            raise KeyError(f"missing tensor {name}")
        value, dtype = self.where[name].read(name)
        if dtype == "I8":  # W8A8 weight used as floats (dequantized exactly)
            scale, _ = self.where[name + "_scale"].read(name + "_scale")
            return value * scale.reshape(-1, 1)
        if dtype == "F8_E4M3":
            scale_name = name + "_scale_inv"
            if scale_name not in self.where:
                raise KeyError(f"FP8 tensor {name} has no {scale_name}")
            scale, _ = self.where[scale_name].read(scale_name)
            value = dequantize_blocks(value, scale, *self.block)
        return value


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


class Config:
    """The config.json fields the forward pass uses (DeepseekV3 names)."""

    REQUIRED = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"]

    def __init__(self, raw):
        for key in self.REQUIRED:
            if key not in raw:
                raise ValueError(f"config.json: missing {key}")
        g = raw.get
        arch = (g("architectures") or [None])[0]
        self.model_type = g("model_type") or (
            "deepseek_v2" if arch == "DeepseekV2ForCausalLM" else "deepseek_v3")
        if self.model_type not in ("deepseek_v3", "kimi_k2", "deepseek_v2"):
            raise ValueError(f"config.json: model_type {self.model_type} not supported")
        v2 = self.model_type == "deepseek_v2"
        self.vocab_size = int(raw["vocab_size"])
        self.hidden_size = int(raw["hidden_size"])
        self.intermediate_size = g("intermediate_size")
        self.moe_intermediate_size = g("moe_intermediate_size")
        self.num_hidden_layers = int(raw["num_hidden_layers"])
        self.num_nextn_predict_layers = int(g("num_nextn_predict_layers") or 0)
        self.num_attention_heads = int(raw["num_attention_heads"])
        self.n_shared_experts = int(g("n_shared_experts") or 0)
        self.n_routed_experts = int(g("n_routed_experts") or 0)
        self.num_experts_per_tok = int(g("num_experts_per_tok") or 0)
        self.n_group = int(g("n_group") or 1)
        self.topk_group = int(g("topk_group") or 1)
        self.first_k_dense_replace = int(g("first_k_dense_replace") or 0)
        self.moe_layer_freq = int(g("moe_layer_freq") or 1)
        self.routed_scaling_factor = float(g("routed_scaling_factor", 1.0))
        self.norm_topk_prob = bool(g("norm_topk_prob", not v2))
        self.scoring_func = g("scoring_func", "softmax" if v2 else "sigmoid")
        self.topk_method = g("topk_method", "greedy" if v2 else "noaux_tc")
        # DeepSeek-V2's gate: normalised or scaled, not both (see the module docstring).
        self.scale_only_unnormalised = v2
        self.q_lora_rank = g("q_lora_rank")
        self.kv_lora_rank = int(raw["kv_lora_rank"])
        self.qk_nope_head_dim = int(raw["qk_nope_head_dim"])
        self.qk_rope_head_dim = int(raw["qk_rope_head_dim"])
        self.v_head_dim = int(raw["v_head_dim"])
        self.rms_norm_eps = float(g("rms_norm_eps", 1e-6))
        self.rope_theta = float(g("rope_theta", 10000.0))
        self.rope_scaling = g("rope_scaling")
        self.tie_word_embeddings = bool(g("tie_word_embeddings", False))
        quant = g("quantization_config") or {}
        self.block = tuple(quant.get("weight_block_size", [128, 128]))

    def is_moe_layer(self, layer):
        return (self.n_routed_experts > 0 and layer >= self.first_k_dense_replace
                and layer % self.moe_layer_freq == 0)


# ----------------------------------------------------------------------------------------
# Building blocks (all float64)
# ----------------------------------------------------------------------------------------


def rms_norm(x, weight, eps):
    """x [..., n], weight [n]: x / sqrt(mean(x^2) + eps) * weight."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def silu(z):
    return z / (1.0 + np.exp(-z))


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def softmax(z, axis=-1):
    z = z - np.max(z, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=axis, keepdims=True)


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(cfg):
    """-> (f [Dr/2] radians per position, cos/sin multiplier, softmax_scale)."""
    dr = cfg.qk_rope_head_dim
    theta = cfg.rope_theta
    i = np.arange(dr // 2, dtype=np.float64)
    extra = theta ** (-2.0 * i / dr)
    softmax_scale = (cfg.qk_nope_head_dim + dr) ** -0.5
    rs = cfg.rope_scaling
    if not rs:
        return extra, 1.0, softmax_scale
    kind = rs.get("type", rs.get("rope_type"))
    if kind != "yarn":
        raise ValueError(f"rope_scaling type {kind} not supported")
    factor = float(rs["factor"])
    m = float(rs.get("original_max_position_embeddings", 4096))
    beta_fast = float(rs.get("beta_fast", 32))
    beta_slow = float(rs.get("beta_slow", 1))
    mscale = float(rs.get("mscale", 1))
    mscale_all_dim = float(rs.get("mscale_all_dim", 0))
    inter = extra / factor

    def corr(n):
        return dr * math.log(m / (n * 2.0 * math.pi)) / (2.0 * math.log(theta))

    low = max(math.floor(corr(beta_fast)), 0)
    high = min(math.ceil(corr(beta_slow)), dr - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((i - low) / (high - low), 0.0, 1.0)
    mask = 1.0 - ramp
    f = inter * (1.0 - mask) + extra * mask
    multiplier = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    if mscale_all_dim:
        softmax_scale *= yarn_get_mscale(factor, mscale_all_dim) ** 2
    return f, multiplier, softmax_scale


def apply_rope(x, positions, freqs, multiplier):
    """x [T, ..., Dr], positions [T]: rotate interleaved pairs (x[2i], x[2i+1]) by p*f_i,
    cos and sin both multiplied by `multiplier`."""
    angle = positions.astype(np.float64)[:, None] * freqs[None, :]  # [T, Dr/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (freqs.size,)
    cos = (np.cos(angle) * multiplier).reshape(shape)
    sin = (np.sin(angle) * multiplier).reshape(shape)
    a = x[..., 0::2]
    b = x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = b * cos + a * sin
    return out


def order_desc(values):
    """Indices sorting `values` descending, ties to the lower index."""
    return np.argsort(-values, kind="stable")


def select_experts(scores, bias, cfg):
    """scores [E] (sigmoid or softmax of the gate logits), bias [E] or None.
    -> (chosen experts [k] sorted ascending, weights [k] aligned with them,
        expert_gap, group_gap): the margins of the two discrete decisions
    (k-th minus (k+1)-th selection score among allowed experts; topk_group-th minus next
    group score), inf where there is no competitor."""
    e = scores.size
    k = cfg.num_experts_per_tok
    if cfg.topk_method == "noaux_tc":
        select = scores + bias
        group_of = lambda g: np.sort(g)[::-1][:2].sum()  # sum of the top-2
    elif cfg.topk_method == "group_limited_greedy":
        select = scores
        group_of = lambda g: np.max(g)
    elif cfg.topk_method == "greedy":
        select = scores
        group_of = None
    else:
        raise ValueError(f"topk_method {cfg.topk_method} not supported")
    allowed = np.ones(e, dtype=bool)
    group_gap = math.inf
    if group_of is not None and cfg.n_group > 1:
        per = e // cfg.n_group
        groups = np.array([group_of(select[g * per : (g + 1) * per]) for g in range(cfg.n_group)])
        gorder = order_desc(groups)
        kept = gorder[: cfg.topk_group]
        if cfg.topk_group < cfg.n_group:
            group_gap = groups[gorder[cfg.topk_group - 1]] - groups[gorder[cfg.topk_group]]
        allowed[:] = False
        for g in kept:
            allowed[g * per : (g + 1) * per] = True
    masked = np.where(allowed, select, -np.inf)
    order = order_desc(masked)
    chosen = order[:k]
    expert_gap = math.inf
    if allowed.sum() > k:
        expert_gap = masked[order[k - 1]] - masked[order[k]]
    weights = scores[chosen].copy()
    normalised = cfg.norm_topk_prob and k > 1
    if normalised:
        weights = weights / (weights.sum() + 1e-20)
    if not (normalised and getattr(cfg, "scale_only_unnormalised", False)):
        weights = weights * cfg.routed_scaling_factor
    sort = np.argsort(chosen)
    return chosen[sort], weights[sort], float(expert_gap), float(group_gap)


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------


def w8a8_linear(x, q, sw):
    """W8A8 (per-token dynamic int8 activations, per-channel int8 weights), in the engine's
    stated arithmetic: per token, in float32, s = absmax / 127 and xq = round-half-even(x / s)
    (a zero row: s = 0, xq = 0); exact integer sums; y = (float32(sum) * sw) * s in float32.
    x [..., in] (float64, taken as float32), q [out, in] int64, sw [out] float32."""
    shape = x.shape
    x32 = np.asarray(x, dtype=np.float32).reshape(-1, shape[-1])
    s = (np.max(np.abs(x32), axis=1) / np.float32(127)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1))
    xq = np.where(s[:, None] > 0, np.rint(x32 / safe[:, None]), 0).astype(np.int64)
    sums = xq @ q.T
    y = (sums.astype(np.float32) * sw[None, :]) * s[:, None]
    return y.astype(np.float64).reshape(shape[:-1] + (q.shape[0],))


class ArrayCheckpoint:
    """In-memory tensors (name -> float64 array), for hand-built models in tests."""

    def __init__(self, arrays):
        self.arrays = arrays

    def has(self, name):
        return name in self.arrays

    def get(self, name):
        if name not in self.arrays:
            raise KeyError(f"missing tensor {name}")
        return np.asarray(self.arrays[name], dtype=np.float64)


class Oracle:
    def __init__(self, model_dir=None, config=None, arrays=None, dequantized=()):
        """Either a model directory, or a config dict plus name -> array (tests).
        dequantized: suffixes of weight names ("kv_b_proj.weight") whose W8A8 weights are
        taken as floats, x @ (q * scale)^T in float64, instead of the integer arithmetic: the
        model those int8 weights state, without the engine's activation rounding."""
        self.dequantized = tuple(dequantized)
        if model_dir is not None:
            with open(os.path.join(model_dir, "config.json")) as f:
                self.cfg = Config(json.load(f))
            self.ckpt = Checkpoint(model_dir, *self.cfg.block)
        else:
            self.cfg = Config(config)
            self.ckpt = ArrayCheckpoint(arrays)
        self.freqs, self.rope_mult, self.softmax_scale = rope_frequencies(self.cfg)
        self._cache = {}
        self._int8 = {}

    def w(self, name):
        if name not in self._cache:
            self._cache[name] = self.ckpt.get(name)
        return self._cache[name]

    def linear(self, x, name):
        """x [..., in] @ weight[out, in]^T -> [..., out]. A W8A8 weight (I8 + per-row scale)
        takes the integer arithmetic instead: w8a8_linear."""
        if name not in self._int8:
            get_int8 = getattr(self.ckpt, "get_int8", None)
            as_float = name.endswith(self.dequantized) if self.dequantized else False
            self._int8[name] = get_int8(name) if get_int8 and not as_float else None
        if self._int8[name] is not None:
            return w8a8_linear(x, *self._int8[name])
        return x @ self.w(name).T

    def mlp(self, x, prefix):
        return self.linear(silu(self.linear(x, prefix + "gate_proj.weight"))
                           * self.linear(x, prefix + "up_proj.weight"), prefix + "down_proj.weight")

    def attention(self, x, positions, prefix):
        """x [T, D] (normed), positions [T] -> [T, D]. Expanded MLA, causal."""
        cfg = self.cfg
        t = x.shape[0]
        h, dn, dr, dv, c = (cfg.num_attention_heads, cfg.qk_nope_head_dim,
                            cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank)
        eps = cfg.rms_norm_eps
        if cfg.q_lora_rank is not None:
            qa = rms_norm(self.linear(x, prefix + "q_a_proj.weight"),
                          self.w(prefix + "q_a_layernorm.weight"), eps)
            q = self.linear(qa, prefix + "q_b_proj.weight")
        else:
            q = self.linear(x, prefix + "q_proj.weight")
        q = q.reshape(t, h, dn + dr)
        q_nope, q_pe = q[:, :, :dn], q[:, :, dn:]                     # [T,H,Dn], [T,H,Dr]
        kv_a = self.linear(x, prefix + "kv_a_proj_with_mqa.weight")  # [T, C+Dr]
        latent = rms_norm(kv_a[:, :c], self.w(prefix + "kv_a_layernorm.weight"), eps)  # [T, C]
        k_pe = kv_a[:, c:]                                             # [T, Dr]
        kv = self.linear(latent, prefix + "kv_b_proj.weight").reshape(t, h, dn + dv)
        k_nope, v = kv[:, :, :dn], kv[:, :, dn:]                      # [T,H,Dn], [T,H,Dv]
        q_pe = apply_rope(q_pe, positions, self.freqs, self.rope_mult)
        k_pe = apply_rope(k_pe, positions, self.freqs, self.rope_mult)
        scores = (np.einsum("thd,shd->hts", q_nope, k_nope)
                  + np.einsum("thd,sd->hts", q_pe, k_pe)) * self.softmax_scale  # [H,T,S]
        causal = np.tril(np.ones((t, t), dtype=bool))
        scores = np.where(causal[None], scores, -np.inf)
        p = softmax(scores, axis=-1)
        o = np.einsum("hts,shd->thd", p, v).reshape(t, h * dv)        # [T, H*Dv]
        return self.linear(o, prefix + "o_proj.weight")

    def moe(self, x, prefix):
        """x [T, D] -> (out [T, D], routing: list per token of (experts, expert_gap, group_gap))."""
        cfg = self.cfg
        logits = self.linear(x, prefix + "gate.weight")                # [T, E]
        if cfg.scoring_func == "sigmoid":
            scores = sigmoid(logits)
        elif cfg.scoring_func == "softmax":
            scores = softmax(logits, axis=-1)
        else:
            raise ValueError(f"scoring_func {cfg.scoring_func} not supported")
        bias = None
        if cfg.topk_method == "noaux_tc":
            bias = self.w(prefix + "gate.e_score_correction_bias")
        out = np.zeros_like(x)
        if cfg.n_shared_experts > 0:
            out += self.mlp(x, prefix + "shared_experts.")
        routing = []
        for t in range(x.shape[0]):
            chosen, weights, egap, ggap = select_experts(scores[t], bias, cfg)
            for e, wgt in zip(chosen, weights):
                out[t] += wgt * self.mlp(x[t], f"{prefix}experts.{e}.")
            routing.append(([int(e) for e in chosen], egap, ggap))
        return out, routing

    def decoder_layer(self, x, positions, layer):
        cfg = self.cfg
        prefix = f"model.layers.{layer}."
        eps = cfg.rms_norm_eps
        h = x + self.attention(rms_norm(x, self.w(prefix + "input_layernorm.weight"), eps),
                               positions, prefix + "self_attn.")
        normed = rms_norm(h, self.w(prefix + "post_attention_layernorm.weight"), eps)
        if cfg.is_moe_layer(layer):
            mlp_out, routing = self.moe(normed, prefix + "mlp.")
        else:
            mlp_out, routing = self.mlp(normed, prefix + "mlp."), None
        return h + mlp_out, routing

    def embed(self, ids, name="model.embed_tokens.weight"):
        return self.w(name)[np.asarray(ids, dtype=np.int64)]

    def lm_head(self, x):
        if self.ckpt.has("lm_head.weight") or not self.cfg.tie_word_embeddings:
            return self.linear(x, "lm_head.weight")
        return self.linear(x, "model.embed_tokens.weight")

    def forward(self, ids):
        """ids [T] -> dict with logits [T, vocab], final_normed [T, D], routing {layer: [...]}."""
        cfg = self.cfg
        positions = np.arange(len(ids))
        x = self.embed(ids)
        routing = {}
        for layer in range(cfg.num_hidden_layers):
            x, r = self.decoder_layer(x, positions, layer)
            if r is not None:
                routing[layer] = r
        final = rms_norm(x, self.w("model.norm.weight"), cfg.rms_norm_eps)
        return {"logits": self.lm_head(final), "final_normed": final, "routing": routing}

    def mtp(self, ids, final_normed):
        """Rows t in 0..T-2 from the main hidden at t and token t+1 -> (logits [T-1, vocab],
        routing of the MTP layer or None). Only the first MTP layer (index L)."""
        cfg = self.cfg
        L = cfg.num_hidden_layers
        pre = f"model.layers.{L}."
        eps = cfg.rms_norm_eps
        emb_name = pre + "embed_tokens.weight"
        if not self.ckpt.has(emb_name):
            emb_name = "model.embed_tokens.weight"
        e = rms_norm(self.embed(ids[1:], emb_name), self.w(pre + "enorm.weight"), eps)  # [T-1, D]
        g = rms_norm(final_normed[:-1], self.w(pre + "hnorm.weight"), eps)              # [T-1, D]
        x = self.linear(np.concatenate([e, g], axis=1), pre + "eh_proj.weight")        # [T-1, D]
        x, routing = self.decoder_layer(x, np.arange(len(ids) - 1), L)
        x = rms_norm(x, self.w(pre + "shared_head.norm.weight"), eps)
        head = pre + "shared_head.head.weight"
        logits = self.linear(x, head) if self.ckpt.has(head) else self.lm_head(x)
        return logits, routing

    def run(self, ids, with_mtp=True):
        """Everything the conformance harness compares, for one token sequence."""
        out = self.forward(ids)
        result = {"logits": out["logits"], "routing": out["routing"], "mtp_logits": None,
                  "mtp_routing": None}
        if with_mtp and self.cfg.num_nextn_predict_layers > 0 and len(ids) >= 2:
            result["mtp_logits"], result["mtp_routing"] = self.mtp(ids, out["final_normed"])
        return result


def routing_to_json(result, cfg):
    """{"layers": {"L": {"experts": [[...] per token], "expert_gap": [...], "group_gap": [...]}},
    "mtp": same for layer num_hidden_layers or null}."""
    def pack(per_token):
        return {"experts": [r[0] for r in per_token],
                "expert_gap": [r[1] if math.isfinite(r[1]) else None for r in per_token],
                "group_gap": [r[2] if math.isfinite(r[2]) else None for r in per_token]}
    layers = {str(layer): pack(r) for layer, r in result["routing"].items()}
    mtp = None
    if result["mtp_routing"] is not None:
        mtp = {"layer": cfg.num_hidden_layers, **pack(result["mtp_routing"])}
    return {"layers": layers, "mtp": mtp}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="output prefix; without it, JSON on stdout")
    ap.add_argument("--no-mtp", action="store_true")
    args = ap.parse_args(argv)
    ids = [int(s) for s in args.ids.replace(" ", "").split(",") if s]
    oracle = Oracle(args.model)
    result = oracle.run(ids, with_mtp=not args.no_mtp)
    routing = routing_to_json(result, oracle.cfg)
    if args.out:
        result["logits"].astype("<f8").tofile(args.out + ".logits.f64")
        if result["mtp_logits"] is not None:
            result["mtp_logits"].astype("<f8").tofile(args.out + ".mtp.f64")
        with open(args.out + ".routing.json", "w") as f:
            json.dump(routing, f)
    else:
        mtp = result["mtp_logits"]
        json.dump({"ids": ids, "logits": result["logits"].tolist(),
                   "mtp_logits": None if mtp is None else mtp.tolist(), "routing": routing},
                  sys.stdout)
        sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
