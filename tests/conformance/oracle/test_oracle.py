#!/usr/bin/python3
"""Self-tests of the float64 oracle against values derived by hand (not from any engine)."""
import json
import math
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ds3_oracle as o  # noqa: E402


def write_st(path, entries):
    """entries: name -> (dtype, shape, raw bytes). A safetensors file built by hand."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, raw) in entries.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def base_config(**over):
    """A 1-layer dense config with tiny dims; fields overridable."""
    cfg = {"vocab_size": 2, "hidden_size": 2, "intermediate_size": 1, "num_hidden_layers": 1,
           "num_attention_heads": 1, "kv_lora_rank": 2, "qk_nope_head_dim": 2,
           "qk_rope_head_dim": 2, "v_head_dim": 2, "q_lora_rank": None, "rms_norm_eps": 0.0,
           "rope_theta": 10000.0, "first_k_dense_replace": 1, "n_routed_experts": 0}
    cfg.update(over)
    return cfg


class NumberFormats(unittest.TestCase):
    def test_fp8_e4m3fn_known_bytes(self):
        t = o.FP8_E4M3FN_TABLE
        self.assertEqual(t[0x00], 0.0)
        self.assertEqual(t[0x01], 2.0**-9)          # smallest subnormal: 1/8 * 2^-6
        self.assertEqual(t[0x07], 7 / 8 * 2.0**-6)  # largest subnormal
        self.assertEqual(t[0x08], 2.0**-6)          # smallest normal
        self.assertEqual(t[0x38], 1.0)              # exponent 7 = bias
        self.assertEqual(t[0x3C], 1.5)
        self.assertEqual(t[0x40], 2.0)
        self.assertEqual(t[0x7E], 448.0)            # max finite: 1.75 * 2^8
        self.assertEqual(t[0xC0], -2.0)
        self.assertEqual(t[0xBC], -1.5)
        self.assertTrue(math.isnan(t[0x7F]) and math.isnan(t[0xFF]))
        self.assertEqual(np.isnan(t).sum(), 2)      # no other NaN, no inf
        self.assertFalse(np.isinf(t).any())
        self.assertEqual(math.copysign(1, t[0x80]), -1.0)

    def test_bf16_f16_f32(self):
        raw = np.frombuffer(struct.pack("<3H", 0x3F80, 0xC000, 0x3FC0), dtype=np.uint8)
        np.testing.assert_array_equal(o.decode_tensor("BF16", raw, (3,)), [1.0, -2.0, 1.5])
        raw = np.frombuffer(struct.pack("<2H", 0x3C00, 0xB800), dtype=np.uint8)
        np.testing.assert_array_equal(o.decode_tensor("F16", raw, (2,)), [1.0, -0.5])
        raw = np.frombuffer(struct.pack("<2f", 0.25, -3.0), dtype=np.uint8)
        np.testing.assert_array_equal(o.decode_tensor("F32", raw, (1, 2)), [[0.25, -3.0]])

    def test_block_dequant_partial_edges(self):
        w = np.ones((130, 200))
        s = np.array([[1.0, 2.0], [3.0, 4.0]])
        d = o.dequantize_blocks(w, s, 128, 128)
        self.assertEqual(d.shape, (130, 200))
        self.assertEqual(d[0, 0], 1.0)
        self.assertEqual(d[127, 127], 1.0)
        self.assertEqual(d[0, 128], 2.0)
        self.assertEqual(d[0, 199], 2.0)
        self.assertEqual(d[128, 0], 3.0)
        self.assertEqual(d[129, 199], 4.0)
        with self.assertRaises(ValueError):
            o.dequantize_blocks(w, np.ones((1, 2)), 128, 128)


class SafetensorsReading(unittest.TestCase):
    def test_sharded_fp8_with_scale_inv(self):
        with tempfile.TemporaryDirectory() as d:
            # Shard 1: a BF16 vector. Shard 2: a [2, 3] FP8 weight and its [1, 1] scale.
            write_st(os.path.join(d, "a.safetensors"),
                     {"v": ("BF16", [2], struct.pack("<2H", 0x3F80, 0x4040))})  # 1, 3
            codes = bytes([0x38, 0x40, 0xC0, 0x3C, 0x00, 0x01])  # 1, 2, -2, 1.5, 0, 2^-9
            write_st(os.path.join(d, "b.safetensors"),
                     {"w.weight": ("F8_E4M3", [2, 3], codes),
                      "w.weight_scale_inv": ("F32", [1, 1], struct.pack("<f", 0.5))})
            with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
                json.dump({"weight_map": {"v": "a.safetensors", "w.weight": "b.safetensors",
                                          "w.weight_scale_inv": "b.safetensors"}}, f)
            ck = o.Checkpoint(d)
            np.testing.assert_array_equal(ck.get("v"), [1.0, 3.0])
            np.testing.assert_array_equal(ck.get("w.weight"),
                                          [[0.5, 1.0, -1.0], [0.75, 0.0, 2.0**-10]])

    def test_truncated_file_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "model.safetensors")
            write_st(p, {"v": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4))})
            with open(p, "r+b") as f:
                f.truncate(os.path.getsize(p) - 4)
            with self.assertRaises(ValueError):
                o.Checkpoint(d)


class Rope(unittest.TestCase):
    def rope_cfg(self, **rs):
        return o.Config(base_config(qk_rope_head_dim=8, qk_nope_head_dim=8, rope_scaling=rs or None))

    def test_plain_frequencies(self):
        f, mult, scale = o.rope_frequencies(self.rope_cfg())
        np.testing.assert_allclose(f, [1.0, 0.1, 0.01, 0.001], rtol=1e-15)
        self.assertEqual(mult, 1.0)
        self.assertEqual(scale, 0.25)  # (8 + 8)^-0.5

    def test_yarn_frequencies_low0_high2(self):
        # Dr 8, theta 1e4, M 64: corr(32) = 8 ln(64/(64 pi)) / (2 ln 1e4) = -0.497 -> low 0;
        # corr(1) = 8 ln(64/(2 pi)) / (2 ln 1e4) = 1.008 -> high 2. ramp = [0, .5, 1, 1].
        # f = inter*ramp + extra*(1-ramp), extra = [1, .1, .01, .001], inter = extra/4.
        f, mult, scale = o.rope_frequencies(self.rope_cfg(
            type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=32,
            beta_slow=1, mscale=1.0, mscale_all_dim=1.0))
        np.testing.assert_allclose(f, [1.0, 0.0625, 0.0025, 0.00025], rtol=1e-14)
        self.assertAlmostEqual(mult, 1.0, places=15)  # mscale / mscale_all_dim both 0.1 ln4 + 1
        self.assertAlmostEqual(scale, 0.25 * (0.1 * math.log(4) + 1) ** 2, places=15)

    def test_yarn_frequencies_low1_high3(self):
        # M 4096: corr(32) = 1.309 -> low 1; corr(1) = 2.814 -> high 3; ramp = [0, 0, .5, 1].
        f, mult, scale = o.rope_frequencies(self.rope_cfg(
            type="yarn", factor=4.0, original_max_position_embeddings=4096, beta_fast=32,
            beta_slow=1, mscale=1.0, mscale_all_dim=0))
        np.testing.assert_allclose(f, [1.0, 0.1, 0.00625, 0.00025], rtol=1e-14)
        self.assertAlmostEqual(mult, 0.1 * math.log(4) + 1, places=15)
        self.assertEqual(scale, 0.25)  # mscale_all_dim 0: softmax scale unchanged

    def test_rope_interleaved_pairs(self):
        x = np.array([[1.0, 0.0, 0.0, 1.0]])  # [T=1, Dr=4]
        out = o.apply_rope(x, np.array([2]), np.array([1.0, 0.01]), 1.0)
        # pair (1, 0) by 2 rad -> (cos 2, sin 2); pair (0, 1) by 0.02 -> (-sin .02, cos .02)
        np.testing.assert_allclose(out[0], [math.cos(2), math.sin(2), -math.sin(0.02),
                                            math.cos(0.02)], rtol=1e-15, atol=1e-16)
        out = o.apply_rope(x, np.array([0]), np.array([1.0, 0.01]), 1.5)
        np.testing.assert_allclose(out[0], [1.5, 0, 0, 1.5])


class Norms(unittest.TestCase):
    def test_rms_norm(self):
        out = o.rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), 0.0)
        # mean(x^2) = 12.5
        np.testing.assert_allclose(out, [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], rtol=1e-15)
        out = o.rms_norm(np.array([1.0, 1.0]), np.array([1.0, 1.0]), 3.0)
        np.testing.assert_allclose(out, [0.5, 0.5], rtol=1e-15)  # 1 / sqrt(1 + 3)


def moe_cfg(**over):
    cfg = base_config(n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                      routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="noaux_tc",
                      scoring_func="sigmoid", first_k_dense_replace=0, moe_intermediate_size=1)
    cfg.update(over)
    return o.Config(cfg)


class Gating(unittest.TestCase):
    def test_noaux_tc_groups(self):
        s = np.array([0.75, 0.25, 0.5, 0.5, 0.125, 0.125, 0.625, 0.0])
        bias = np.array([0, 0, 0, 0, 0, 0, 0, 0.375])
        # biased: [.75 .25 | .5 .5 | .125 .125 | .625 .375]; group sums: 1, 1, .25, 1
        # top-2 groups: 3 (1.0; ties lower first -> 0 and 1 ahead of 3? all three tie at 1.0:
        # order 0, 1, 3 -> kept groups 0 and 1). Allowed experts 0..3: top-2 = 0 (.75),
        # then 2 (.5, tie with 3 -> lower index). Expert 6 (.625) is excluded by its group.
        chosen, w, egap, ggap = o.select_experts(s, bias, moe_cfg())
        self.assertEqual(list(chosen), [0, 2])
        np.testing.assert_allclose(w, [0.75 / 1.25 * 2.5, 0.5 / 1.25 * 2.5], rtol=1e-15)
        self.assertEqual(egap, 0.0)   # .5 vs .5
        self.assertEqual(ggap, 0.0)   # group 1 (1.0) vs group 3 (1.0)

    def test_noaux_tc_bias_selects_weights_unbiased(self):
        s = np.array([0.75, 0.25, 0.5, 0.5, 0.125, 0.125, 0.625, 0.0])
        bias = np.array([0, 0, 0, 0, 0, 0, 0.25, 0.5])
        # biased: [.75 .25 | .5 .5 | .125 .125 | .875 .5]; groups 1, 1, .25, 1.375 -> keep 3, 0
        # allowed 0, 1, 6, 7: biased .75 .25 .875 .5 -> top-2 = 6, 0; next is 7 (.5)
        chosen, w, egap, ggap = o.select_experts(s, bias, moe_cfg())
        self.assertEqual(list(chosen), [0, 6])
        np.testing.assert_allclose(w, [0.75 / 1.375 * 2.5, 0.625 / 1.375 * 2.5], rtol=1e-15)
        self.assertEqual(egap, 0.25)   # .75 - .5
        self.assertEqual(ggap, 0.0)    # group 0 (1.0) vs group 1 (1.0)

    def test_group_gap_and_k1_no_normalisation(self):
        s = np.array([0.5, 0.25, 0.125, 0.0])
        cfg = moe_cfg(n_routed_experts=4, num_experts_per_tok=1, n_group=2, topk_group=1)
        chosen, w, egap, ggap = o.select_experts(s, np.zeros(4), cfg)
        self.assertEqual(list(chosen), [0])
        self.assertEqual(w[0], 0.5 * 2.5)   # k = 1: no normalisation
        self.assertEqual(egap, 0.25)        # .5 vs .25 within the kept group
        self.assertEqual(ggap, 0.625)       # .75 vs .125

    def test_greedy_softmax(self):
        logits = np.log(np.array([1.0, 2.0, 4.0, 1.0]))
        cfg = moe_cfg(n_routed_experts=4, n_group=1, topk_group=1, topk_method="greedy",
                      scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0)
        chosen, w, egap, _ = o.select_experts(o.softmax(logits), None, cfg)
        self.assertEqual(list(chosen), [1, 2])
        np.testing.assert_allclose(w, [2 / 8, 4 / 8], rtol=1e-15)
        self.assertAlmostEqual(egap, 1 / 8, places=15)

    def v2_cfg(self, **over):
        cfg = dict(model_type="deepseek_v2", n_routed_experts=8, num_experts_per_tok=2,
                   n_group=4, topk_group=1, topk_method="group_limited_greedy",
                   scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=16.0)
        cfg.update(over)
        return moe_cfg(**cfg)

    def test_v2_group_limited_greedy_ranks_groups_by_their_best(self):
        # g0: .375 .0625 | g1: .25 .25 | g2: .0625 0 | g3: 0 0 -> best .375 keeps g0, although
        # g1's two best sum to more (.5 > .4375, V3's rule would keep g1).
        s = np.array([0.375, 0.0625, 0.25, 0.25, 0.0625, 0.0, 0.0, 0.0])
        chosen, w, egap, ggap = o.select_experts(s, None, self.v2_cfg())
        self.assertEqual(list(chosen), [0, 1])
        np.testing.assert_allclose(w, [0.375 * 16, 0.0625 * 16], rtol=1e-15)  # scaled only
        self.assertEqual(ggap, 0.125)         # .375 vs .25
        self.assertEqual(egap, math.inf)      # the kept group has exactly k experts

    def test_v2_normalises_or_scales_never_both(self):
        s = np.array([0.375, 0.0625, 0.25, 0.25, 0.0625, 0.0, 0.0, 0.0])
        _, w, _, _ = o.select_experts(s, None, self.v2_cfg(norm_topk_prob=True))
        np.testing.assert_allclose(w, [0.375 / 0.4375, 0.0625 / 0.4375], rtol=1e-15)
        _, w, _, _ = o.select_experts(s, None, self.v2_cfg(norm_topk_prob=True,
                                                           num_experts_per_tok=1))
        np.testing.assert_allclose(w, [0.375 * 16], rtol=1e-15)  # k = 1: scaled

    def test_v2_defaults(self):
        cfg = base_config()
        cfg.update(model_type="deepseek_v2", n_routed_experts=8, num_experts_per_tok=2)
        c = o.Config(cfg)
        self.assertEqual((c.scoring_func, c.topk_method, c.norm_topk_prob),
                         ("softmax", "greedy", False))
        cfg.pop("model_type")
        cfg["architectures"] = ["DeepseekV2ForCausalLM"]
        self.assertEqual(o.Config(cfg).model_type, "deepseek_v2")


class Attention(unittest.TestCase):
    def build(self, q_rows, kva_rows):
        """H 1, Dn = Dr = Dv = C = D = 2. kv_b = identity stacked (k_nope = v = latent)."""
        arrays = {"model.layers.0.self_attn.q_proj.weight": np.array(q_rows, dtype=float),
                  "model.layers.0.self_attn.kv_a_proj_with_mqa.weight":
                      np.array(kva_rows, dtype=float),
                  "model.layers.0.self_attn.kv_a_layernorm.weight": np.ones(2),
                  "model.layers.0.self_attn.kv_b_proj.weight": np.vstack([np.eye(2)] * 2),
                  "model.layers.0.self_attn.o_proj.weight": np.eye(2)}
        return o.Oracle(config=base_config(), arrays=arrays)

    def test_nope_only(self):
        # q_nope = x, q_pe = 0; latent = rmsnorm(x), k_pe = 0. x0 = [1, 1], x1 = [1, -1] have
        # rms 1. scale = 4^-0.5. Row 1 scores: [x1.x0, x1.x1] / 2 = [0, 1].
        m = self.build([[1, 0], [0, 1], [0, 0], [0, 0]], [[1, 0], [0, 1], [0, 0], [0, 0]])
        x = np.array([[1.0, 1.0], [1.0, -1.0]])
        out = m.attention(x, np.array([0, 1]), "model.layers.0.self_attn.")
        e = math.e
        np.testing.assert_allclose(out[0], [1, 1], rtol=1e-15)  # attends itself only
        np.testing.assert_allclose(out[1], [1, (1 - e) / (1 + e)], rtol=1e-14)

    def test_rope_only(self):
        # q_nope = 0, q_pe = x, k_pe = x, f_0 = 1. Row 1: q = R(1) x1, keys x0 (pos 0) and
        # R(1) x1: dots = 2 sin 1 and 2, times 1/2 -> [sin 1, 1].
        m = self.build([[0, 0], [0, 0], [1, 0], [0, 1]], [[1, 0], [0, 1], [1, 0], [0, 1]])
        x = np.array([[1.0, 1.0], [1.0, -1.0]])
        out = m.attention(x, np.array([0, 1]), "model.layers.0.self_attn.")
        p0 = math.exp(math.sin(1)) / (math.exp(math.sin(1)) + math.e)
        np.testing.assert_allclose(out[1], [1, p0 - (1 - p0)], rtol=1e-14)


class Model(unittest.TestCase):
    def arrays(self, cfg):
        """Attention and MLP weights zero: each layer is the identity on the residual."""
        d = cfg["hidden_size"]
        a = {"model.embed_tokens.weight": np.array([[3.0, 4.0], [1.0, -1.0]]),
             "model.norm.weight": np.array([1.0, 2.0]),
             "lm_head.weight": np.array([[1.0, 0.0], [1.0, 1.0]])}
        for layer in range(cfg["num_hidden_layers"] + cfg.get("num_nextn_predict_layers", 0)):
            p = f"model.layers.{layer}."
            for n in ["input_layernorm", "post_attention_layernorm",
                      "self_attn.kv_a_layernorm"]:
                a[p + n + ".weight"] = np.ones(2)
            a[p + "self_attn.q_proj.weight"] = np.zeros((4, d))
            a[p + "self_attn.kv_a_proj_with_mqa.weight"] = np.zeros((4, d))
            a[p + "self_attn.kv_b_proj.weight"] = np.zeros((4, 2))
            a[p + "self_attn.o_proj.weight"] = np.zeros((d, 2))
            for n in ["gate_proj", "up_proj"]:
                a[p + f"mlp.{n}.weight"] = np.zeros((1, d))
            a[p + "mlp.down_proj.weight"] = np.zeros((d, 1))
        return a

    # rms_norm_eps 1e-300: zero vectors (the zero weights' outputs) normalise to zero, not NaN,
    # and nonzero ones exactly as with eps 0.
    def test_forward_identity_layers(self):
        cfg = base_config(rms_norm_eps=1e-300)
        out = o.Oracle(config=cfg, arrays=self.arrays(cfg)).forward([0, 1])
        r = 1 / math.sqrt(12.5)  # rmsnorm of [3, 4], then weight [1, 2] -> [3r, 8r]
        np.testing.assert_allclose(out["logits"][0], [3 * r, 11 * r], rtol=1e-14)
        np.testing.assert_allclose(out["logits"][1], [1, 1 - 2], rtol=1e-14)  # [1, -2]

    def test_mtp_concat_order_and_next_token(self):
        cfg = base_config(num_nextn_predict_layers=1, rms_norm_eps=1e-300)
        a = self.arrays(cfg)
        p = "model.layers.1."
        for n in ["enorm", "hnorm", "shared_head.norm"]:
            a[p + n + ".weight"] = np.ones(2)
        a[p + "eh_proj.weight"] = np.hstack([np.eye(2), np.zeros((2, 2))])  # embedding half
        a[p + "shared_head.head.weight"] = np.eye(2)
        m = o.Oracle(config=cfg, arrays=a)
        res = m.run([0, 1])
        # row 0 uses token 1: embed [1, -1] -> rmsnorm -> [1, -1] (twice)
        np.testing.assert_allclose(res["mtp_logits"], [[1, -1]], rtol=1e-14)
        a[p + "eh_proj.weight"] = np.hstack([np.zeros((2, 2)), np.eye(2)])  # hidden half
        res = o.Oracle(config=cfg, arrays=a).run([0, 1])
        # hmain_0 = [3r, 8r]; rmsnorm(rmsnorm(.)) = [3, 8] / sqrt(36.5)
        np.testing.assert_allclose(res["mtp_logits"], [[3 / math.sqrt(36.5), 8 / math.sqrt(36.5)]],
                                   rtol=1e-14)

    def test_moe_layer_by_hand(self):
        cfg = base_config(n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1,
                          routed_scaling_factor=2.0, first_k_dense_replace=0,
                          moe_intermediate_size=1, n_shared_experts=1, topk_method="noaux_tc")
        p = "model.layers.0.mlp."
        a = {p + "gate.weight": np.array([[1.0, 0.0], [0.0, 1.0]]),
             p + "gate.e_score_correction_bias": np.array([0.0, 0.0])}
        for e, row in [(0, [1.0, 0.0]), (1, [0.0, 1.0])]:
            a[f"{p}experts.{e}.gate_proj.weight"] = np.array([row])
            a[f"{p}experts.{e}.up_proj.weight"] = np.array([[1.0, 1.0]])
            a[f"{p}experts.{e}.down_proj.weight"] = np.array([[1.0], [0.0]])
        a[p + "shared_experts.gate_proj.weight"] = np.array([[0.0, 0.0]])  # silu(0) = 0
        a[p + "shared_experts.up_proj.weight"] = np.array([[1.0, 1.0]])
        a[p + "shared_experts.down_proj.weight"] = np.array([[1.0], [1.0]])
        m = o.Oracle(config=cfg, arrays=a)
        x = np.array([[2.0, 1.0]])
        out, routing = m.moe(x, p)
        # scores sigmoid(2) > sigmoid(1): expert 0, weight sigmoid(2) * 2 (k = 1).
        # expert 0: silu(2) * 3 into output 0.
        s2 = 1 / (1 + math.exp(-2))
        np.testing.assert_allclose(out[0], [2 * s2 * (2 * s2) * 3, 0.0], rtol=1e-14)
        self.assertEqual(routing[0][0], [0])
        self.assertAlmostEqual(routing[0][1], s2 - 1 / (1 + math.exp(-1)), places=15)


class W8A8Test(unittest.TestCase):
    def test_linear_by_hand(self):
        # Token 0: absmax 254 -> s = 2; x / s = 63.5, -127, 31.75 -> 64 (half to even), -127,
        # 32. Row 0: 64 - 254 + 96 = -94 -> -94 * 0.5 * 2 = -94. Row 1: -64 + 0 + 32 * 127 =
        # 4000 -> 4000 * 0.25 * 2 = 2000. Token 1 is zero: s = 0, outputs 0.
        x = np.array([[127.0, -254.0, 63.5], [0.0, 0.0, 0.0]])
        q = np.array([[1, 2, 3], [-1, 0, 127]], dtype=np.int64)
        sw = np.array([0.5, 0.25], dtype=np.float32)
        y = o.w8a8_linear(x, q, sw)
        np.testing.assert_array_equal(y, [[-94.0, 2000.0], [0.0, 0.0]])

    def test_half_rounds_to_even_both_ways(self):
        # s = 1: 2.5 -> 2, -1.5 -> -2, 0.5 -> 0; sum against ones = 0 with the max 127.
        x = np.array([[2.5, -1.5, 0.5, 127.0]])
        y = o.w8a8_linear(x, np.array([[1, 1, 1, 0]], dtype=np.int64), np.ones(1, np.float32))
        np.testing.assert_array_equal(y, [[0.0]])


if __name__ == "__main__":
    unittest.main()
