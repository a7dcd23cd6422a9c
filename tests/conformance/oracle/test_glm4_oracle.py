#!/usr/bin/python3
"""Self-tests of the GLM-4.5 float64 oracle against values derived by hand."""
import math
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm4_oracle as g  # noqa: E402


def config(**over):
    raw = {"vocab_size": 4, "hidden_size": 2, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 2,
           "moe_intermediate_size": 2, "n_routed_experts": 4, "num_experts_per_tok": 2,
           "rms_norm_eps": 0.0}
    raw.update(over)
    return g.Config(raw)


class ArrayOracle(g.Oracle):
    """The oracle over arrays given by name (no files)."""

    def __init__(self, cfg, arrays):  # pylint: disable=super-init-not-called
        self.cfg = cfg
        rd = cfg.rotary_dim
        self.inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
        self._cache = dict(arrays)

    def has(self, name):
        return name in self._cache


class Glm4Oracle(unittest.TestCase):
    def test_defaults_as_transformers(self):
        cfg = config()
        self.assertEqual(cfg.partial_rotary_factor, 0.5)
        self.assertEqual(cfg.rotary_dim, 2)
        self.assertEqual(cfg.first_k_dense_replace, 1)
        self.assertEqual([cfg.is_moe_layer(i) for i in range(3)], [False, True, True])

    def test_partial_rotate_half(self):
        # head_dim 8, factor 0.5: dims 0..3 rotate (i pairs with i + 2), dims 4..7 pass.
        o = ArrayOracle(config(head_dim=8, rope_theta=100.0), {})
        x = np.arange(1.0, 9.0).reshape(1, 1, 8)
        out = o.rope(x, np.array([1.0]))
        f0, f1 = 1.0, 100.0 ** -0.5  # theta^-(0/4), theta^-(2/4)
        want = [1 * math.cos(f0) - 3 * math.sin(f0), 2 * math.cos(f1) - 4 * math.sin(f1),
                3 * math.cos(f0) + 1 * math.sin(f0), 4 * math.cos(f1) + 2 * math.sin(f1),
                5, 6, 7, 8]
        np.testing.assert_allclose(out[0, 0], want, rtol=1e-14)

    def test_full_rotary_factor_one(self):
        o = ArrayOracle(config(head_dim=2, partial_rotary_factor=1.0), {})
        out = o.rope(np.array([[[1.0, 0.0]]]), np.array([0.5]))
        np.testing.assert_allclose(out[0, 0], [math.cos(0.5), math.sin(0.5)])

    def test_route_groups_bias_and_scaling(self):
        # 4 experts in 2 groups, keep 1 group, top-2, normalised, × 2.
        cfg = config(n_group=2, topk_group=1, routed_scaling_factor=2.0)
        scores = np.array([0.9, 0.1, 0.5, 0.45])
        bias = np.array([0.0, 0.0, 0.1, 0.1])
        # group sums of biased scores: 1.0 and 1.15 -> group 1 (experts 2, 3)
        chosen, weights, egap, ggap = g.route(scores, bias, cfg)
        self.assertEqual(list(chosen), [2, 3])
        np.testing.assert_allclose(weights, [2 * 0.5 / 0.95, 2 * 0.45 / 0.95])
        self.assertAlmostEqual(ggap, 0.15)
        # masked experts are 0.0 (not -inf): the 2nd chosen 0.55 against 0.0
        self.assertAlmostEqual(egap, 0.55)

    def test_top1_normalised_to_one_then_scaled(self):
        cfg = config(num_experts_per_tok=1, routed_scaling_factor=2.5)
        chosen, weights, _, _ = g.route(np.array([0.2, 0.7, 0.1, 0.3]), np.zeros(4), cfg)
        self.assertEqual(list(chosen), [1])
        np.testing.assert_allclose(weights, [2.5])

    def test_attention_biases_and_one_token(self):
        # One token: softmax over one position is 1, so each head outputs v = W_v x + b_v.
        cfg = config(attention_bias=True, head_dim=2, partial_rotary_factor=1.0)
        arr = {"p.q_proj.weight": np.zeros((4, 2)), "p.q_proj.bias": np.ones(4),
               "p.k_proj.weight": np.zeros((2, 2)), "p.k_proj.bias": np.ones(2),
               "p.v_proj.weight": np.eye(2), "p.v_proj.bias": np.array([0.5, -1.0]),
               "p.o_proj.weight": np.array([[1.0, 0, 1, 0], [0, 1, 0, 1]])}
        out = ArrayOracle(cfg, arr).attention(np.array([[2.0, 3.0]]), np.array([0]), "p.")
        np.testing.assert_allclose(out, [[2 * 2.5, 2 * 2.0]])


if __name__ == "__main__":
    unittest.main()
