#!/usr/bin/python3
"""Self-tests of the Qwen3-MoE float64 oracle against values derived by hand."""
import math
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_oracle as q  # noqa: E402


def config(**over):
    raw = {"vocab_size": 4, "hidden_size": 2, "num_hidden_layers": 4, "num_attention_heads": 2,
           "num_key_value_heads": 1, "head_dim": 2, "intermediate_size": 2,
           "moe_intermediate_size": 2, "num_experts": 3, "num_experts_per_tok": 2,
           "rms_norm_eps": 0.0}
    raw.update(over)
    return q.Config(raw)


class ArrayOracle(q.Oracle):
    """The oracle over arrays given by name (no files)."""

    def __init__(self, cfg, arrays):  # pylint: disable=super-init-not-called
        self.cfg = cfg
        self.inv_freq, self.attention_factor = q.rope_inv_freq(cfg)
        self._cache = dict(arrays)


class Qwen3Oracle(unittest.TestCase):
    def test_head_dim_defaults_to_hidden_over_heads(self):
        self.assertEqual(config(head_dim=None, hidden_size=8, num_attention_heads=4).head_dim, 2)
        self.assertEqual(config(head_dim=6).head_dim, 6)

    def test_sparse_layers(self):
        cfg = config(decoder_sparse_step=2, mlp_only_layers=[3])
        self.assertEqual([cfg.is_moe_layer(i) for i in range(4)], [False, True, False, False])
        self.assertFalse(config(num_experts=0).is_moe_layer(0))

    def test_rotate_half_rope(self):
        # head_dim 2: one frequency, 1 / theta^0 = 1; (x0, x1) rotates by p radians.
        o = ArrayOracle(config(), {})
        out = o.rope(np.array([[[1.0, 0.0]], [[0.0, 2.0]]]), np.array([0.5, 2.0]))
        np.testing.assert_allclose(out[0, 0], [math.cos(0.5), math.sin(0.5)])
        np.testing.assert_allclose(out[1, 0], [-2 * math.sin(2.0), 2 * math.cos(2.0)])
        # head_dim 4: element i pairs with i + 2 (not with i + 1).
        o = ArrayOracle(config(head_dim=4, rope_theta=100.0), {})
        out = o.rope(np.array([[[1.0, 0.0, 0.0, 0.0]]]), np.array([1.0]))
        np.testing.assert_allclose(out[0, 0], [math.cos(1), 0, math.sin(1), 0], atol=1e-15)

    def test_yarn_attention_factor(self):
        cfg = config(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 32})
        self.assertAlmostEqual(q.rope_inv_freq(cfg)[1], 0.1 * math.log(4.0) + 1.0)

    def test_one_token_attention_is_v_through_o_proj(self):
        # softmax over a single position is 1: each query head outputs its KV head's v.
        cfg = config(num_attention_heads=2, num_key_value_heads=1, head_dim=2)
        arrays = {"a.q_proj.weight": np.ones((4, 2)), "a.k_proj.weight": np.ones((2, 2)),
                  "a.v_proj.weight": np.array([[1.0, 0.0], [0.0, 3.0]]),
                  "a.o_proj.weight": np.array([[1.0, 0, 0, 0], [0, 0, 0, 1.0]]),
                  "a.q_norm.weight": np.ones(2), "a.k_norm.weight": np.ones(2)}
        out = ArrayOracle(cfg, arrays).attention(np.array([[2.0, 5.0]]), np.array([0]), "a.")
        # v = (2, 15); heads concatenated (2, 15, 2, 15); o_proj picks elements 0 and 3.
        np.testing.assert_allclose(out, [[2.0, 15.0]])

    def test_moe_weights_normalised_or_not(self):
        # Router logits (0, ln 2, ln 3) -> probabilities (1/6, 2/6, 3/6); top-2 = experts 2, 1.
        # Expert e's MLP gives (e + 1) · silu(1) · 1 in every output (weights built for it).
        arrays = {"m.gate.weight": np.array([[0.0, 0.0], [math.log(2), 0.0], [math.log(3), 0.0]])}
        for e in range(3):
            arrays[f"m.experts.{e}.gate_proj.weight"] = np.array([[1.0, 0.0], [0.0, 0.0]])
            arrays[f"m.experts.{e}.up_proj.weight"] = np.array([[1.0, 0.0], [0.0, 0.0]])
            arrays[f"m.experts.{e}.down_proj.weight"] = np.array([[e + 1.0, 0.0], [e + 1.0, 0.0]])
        x = np.array([[1.0, 0.0]])
        unit = 1.0 / (1.0 + math.exp(-1.0))  # silu(1) · 1
        for norm, (w2, w1) in [(False, (3 / 6, 2 / 6)), (True, (3 / 5, 2 / 5))]:
            out, routing = ArrayOracle(config(norm_topk_prob=norm), arrays).moe(x, "m.")
            want = (w2 * 3 + w1 * 2) * unit
            np.testing.assert_allclose(out, [[want, want]])
            self.assertEqual(routing[0][0], [1, 2])
            self.assertAlmostEqual(routing[0][1], 2 / 6 - 1 / 6)


if __name__ == "__main__":
    unittest.main()
