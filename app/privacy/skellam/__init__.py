"""Distributed differential privacy over secure aggregation with the Skellam mechanism (Agarwal,
Kairouz & Liu, NeurIPS 2021): the silo's encoding and the server's decoding (encoding.py), the
Renyi accountant (accounting.py) and a plan's calibration at a scale chosen from the bits
(calibration.py, imported on its own: it reads app/privacy/accounting.py). numpy and math only; dp-accounting is loaded
when an epsilon is computed."""

from app.privacy.skellam.accounting import AMPLIFICATIONS, ORDERS, epsilon, skellam_curve, skellam_rdp, wbk_theorem9
from app.privacy.skellam.encoding import (BETA, MAX_TRIES, WRAP_TARGET, GammaChoice, SkellamCode, choose_gamma,
                                          conditional_round, coordinate_bias_bound, decode_sum, encode, modular_sum,
                                          padded_dim, rotate, rounded_row_bound, rounding_bias_bound, row_sq_bound,
                                          sensitivity, skellam_noise, unrotate, wrap_probability)

__all__ = ["AMPLIFICATIONS", "BETA", "MAX_TRIES", "ORDERS", "WRAP_TARGET", "GammaChoice", "SkellamCode",
           "choose_gamma", "conditional_round", "coordinate_bias_bound", "decode_sum", "encode",
           "epsilon", "modular_sum", "padded_dim", "rotate", "rounded_row_bound",
           "rounding_bias_bound", "row_sq_bound", "sensitivity", "skellam_curve", "skellam_noise", "skellam_rdp",
           "unrotate", "wbk_theorem9", "wrap_probability"]
