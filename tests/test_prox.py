"""app/prox.py against independent facts: numerical minimisation of the prox objective, the Moreau
decomposition with closed-form conjugates written here, projection characterisations, firm
non-expansiveness, values and the gradient mapping. Fixed seeds; well under a few seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from app.prox import (
    PROX_KINDS,
    Box,
    ElasticNet,
    GroupLasso,
    L1,
    L2Ball,
    NoProx,
    Prox,
    SquaredL2,
    gradient_mapping,
    gradient_mapping_vector,
    make_prox,
)

SHAPES = {"fc.weight": (2, 3), "fc.bias": (3,), "out.weight": (2,)}  # 11 parameters, three layers
ETAS = (0.4, 1.7)


def params(seed: int, scale: float = 1.5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}


def flat(d) -> np.ndarray:
    return np.concatenate([np.asarray(d[k], dtype=np.float64).ravel() for k in SHAPES])


def unflat(x: np.ndarray) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for k, s in SHAPES.items():
        n = int(np.prod(s))
        out[k] = x[i : i + n].reshape(s)
        i += n
    return out


def slices(groups) -> list[np.ndarray]:
    """Flat index sets of groups of layer names."""
    start, idx = 0, {}
    for k, s in SHAPES.items():
        n = int(np.prod(s))
        idx[k] = np.arange(start, start + n)
        start += n
    return [np.concatenate([idx[k] for k in g]) for g in groups]


def all_kinds() -> list[Prox]:
    return [
        NoProx(),
        L1(0.6),
        SquaredL2(0.9),
        ElasticNet(0.5, 0.8),
        GroupLasso(1.1),
        GroupLasso(0.9, groups=[["fc.weight", "fc.bias"]]),
        L2Ball(2.0),
        Box(-0.7, 0.4),
    ]


# ----------------------------------------------------------------------------- numerical argmin


def numeric_prox(kind: str, z: np.ndarray, eta: float, **p) -> np.ndarray:
    """argmin_w f1(w) + ||w - z||^2 / (2 eta) by a generic solver (flat float64 vectors)."""
    n = z.size
    quad = lambda w: ((w - z) ** 2).sum() / (2 * eta)  # noqa: E731
    dquad = lambda w: (w - z) / eta  # noqa: E731
    opts = {"ftol": 1e-15, "maxiter": 1000}
    if kind == "l2":
        r = minimize(lambda w: quad(w) + 0.5 * p["lam"] * (w @ w), np.zeros(n),
                     jac=lambda w: dquad(w) + p["lam"] * w, method="BFGS", options={"gtol": 1e-12})
        return r.x
    if kind in ("l1", "elastic-net"):
        # epigraph form: min l1 * sum(t) + (l2/2)||w||^2 + quad  s.t. -t <= w <= t (smooth, linear constraints)
        l1, l2 = p["l1"], p.get("l2", 0.0)
        A = np.block([[-np.eye(n), np.eye(n)], [np.eye(n), np.eye(n)]])
        r = minimize(
            lambda x: l1 * x[n:].sum() + 0.5 * l2 * (x[:n] @ x[:n]) + quad(x[:n]),
            np.concatenate([np.zeros(n), np.ones(n)]),
            jac=lambda x: np.concatenate([dquad(x[:n]) + l2 * x[:n], l1 * np.ones(n)]),
            constraints=[{"type": "ineq", "fun": lambda x: A @ x, "jac": lambda x: A}],
            method="SLSQP", options=opts,
        )
        return r.x[:n]
    if kind == "group-lasso":
        # non-smooth objective, derivative-free (Powell converges to ~1e-8 here), started at 0
        idx = slices(p["groups"])
        F = lambda w: p["lam"] * sum(np.linalg.norm(w[g]) for g in idx) + quad(w)  # noqa: E731
        r = minimize(F, np.zeros(n), method="Powell", options={"xtol": 1e-12, "ftol": 1e-15, "maxiter": 100000})
        return r.x
    if kind == "l2-ball":
        R = p["r"]
        r = minimize(quad, np.zeros(n), jac=dquad, method="SLSQP", options=opts,
                     constraints=[{"type": "ineq", "fun": lambda w: R**2 - w @ w, "jac": lambda w: -2 * w}])
        return r.x
    if kind == "box":
        r = minimize(quad, np.zeros(n), jac=dquad, method="L-BFGS-B", bounds=[(p["lo"], p["hi"])] * n,
                     options={"ftol": 1e-15, "gtol": 1e-12})
        return r.x
    raise AssertionError(kind)


CASES = [
    (L1(0.6), "l1", {"l1": 0.6}),
    (SquaredL2(0.9), "l2", {"lam": 0.9}),
    (ElasticNet(0.5, 0.8), "elastic-net", {"l1": 0.5, "l2": 0.8}),
    (GroupLasso(1.1), "group-lasso", {"lam": 1.1, "groups": [[k] for k in SHAPES]}),
    (GroupLasso(0.9, groups=[["fc.weight", "out.weight"]]), "group-lasso",
     {"lam": 0.9, "groups": [["fc.weight", "out.weight"]]}),
    (L2Ball(2.0), "l2-ball", {"r": 2.0}),
    (Box(-0.7, 0.4), "box", {"lo": -0.7, "hi": 0.4}),
]


@pytest.mark.parametrize("eta", ETAS)
@pytest.mark.parametrize("prox,kind,p", CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_closed_form_equals_numerical_argmin(prox, kind, p, eta):
    z = params(1)
    z["out.weight"] *= 0.1  # a small layer: thresholded to exactly 0 by l1 / group lasso
    got = prox(z, eta)
    want = numeric_prox(kind, flat(z), eta, **p)
    np.testing.assert_allclose(flat(got), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("prox,f1", [
    (L1(0.6), lambda w: 0.6 * abs(w)),
    (SquaredL2(0.9), lambda w: 0.45 * w * w),
    (ElasticNet(0.5, 0.8), lambda w: 0.5 * abs(w) + 0.4 * w * w),
    (Box(-0.7, 0.4), lambda w: np.where((w >= -0.7) & (w <= 0.4), 0.0, np.inf)),
], ids=["l1", "l2", "elastic-net", "box"])
def test_scalar_brute_force(prox, f1):
    """1-D: brute-force grid search (coarse to fine) of f1(w) + (w - z)^2 / (2 eta)."""
    eta = 0.8
    for z0 in (-2.3, -0.35, 0.0, 0.2, 0.45, 1.9):
        lo, hi = -4.0, 4.0
        for _ in range(6):
            grid = np.linspace(lo, hi, 2001)
            best = grid[np.argmin(f1(grid) + (grid - z0) ** 2 / (2 * eta))]
            step = (hi - lo) / 2000
            lo, hi = best - 5 * step, best + 5 * step
        got = prox({"x": np.array([z0], np.float32)}, eta)["x"][0]
        assert abs(got - best) < 1e-5, (z0, got, best)


# ----------------------------------------------------------------------------- Moreau decomposition
# z = prox_{eta f}(z) + eta * prox_{f*/eta}(z / eta), conjugates written out here.


def clip_linf(v, lam):  # prox of (indicator of l_inf ball radius lam)/eta: projection
    return np.clip(v, -lam, lam)


def block_soft(v, t):  # prox of t*||.||_2
    n = np.linalg.norm(v)
    return np.zeros_like(v) if n == 0 else max(0.0, 1 - t / n) * v


def proj_ball(v, r):
    n = np.linalg.norm(v)
    return v if n <= r else v * (r / n)


@pytest.mark.parametrize("eta", ETAS)
@pytest.mark.parametrize("seed", [3, 4])
def test_moreau_l1(eta, seed):
    lam = 0.6
    z = flat(params(seed))
    p = flat(L1(lam)(unflat(z), eta))
    np.testing.assert_allclose(p + eta * clip_linf(z / eta, lam), z, atol=1e-6)


@pytest.mark.parametrize("eta", ETAS)
@pytest.mark.parametrize("scale", [0.3, 2.0])  # inside and outside the ball
def test_moreau_l2_ball(eta, scale):
    r = 2.0
    z = flat(params(5, scale))
    p = flat(L2Ball(r)(unflat(z), eta))
    # f = indicator of the r-ball  ->  f* = r||.||_2, prox_{f*/eta}(v) = block_soft(v, r/eta)
    np.testing.assert_allclose(p + eta * block_soft(z / eta, r / eta), z, atol=1e-6)


@pytest.mark.parametrize("eta", ETAS)
def test_moreau_group_lasso(eta):
    lam = 1.1
    z = params(6)
    z["out.weight"] *= 0.1
    p = flat(GroupLasso(lam)(z, eta))
    zf = flat(z)
    # f* = indicator of the product of lam-balls (one per layer): projection per group
    dual = np.concatenate([proj_ball(zf[g] / eta, lam) for g in slices([[k] for k in SHAPES])])
    np.testing.assert_allclose(p + eta * dual, zf, atol=1e-6)


@pytest.mark.parametrize("eta", ETAS)
def test_moreau_squared_l2(eta):
    lam = 0.9
    z = flat(params(7))
    p = flat(SquaredL2(lam)(unflat(z), eta))
    # f* = ||.||^2 / (2 lam): prox_{f*/eta}(v) = v / (1 + 1/(eta lam))
    np.testing.assert_allclose(p + eta * (z / eta) / (1 + 1 / (eta * lam)), z, atol=1e-6)


def test_box_prox_is_projection():
    lo, hi = -0.7, 0.4
    box = Box(lo, hi)
    rng = np.random.default_rng(8)
    z = params(8)
    p = box(z, 1.3)
    assert box.value(p) == 0.0
    np.testing.assert_array_equal(flat(box(p, 0.2)), flat(p))  # idempotent
    zf, pf = flat(z), flat(p)
    for _ in range(50):  # variational inequality <z - p, y - p> <= 0 for every y in the box
        y = rng.uniform(lo, hi, size=zf.size)
        assert (zf - pf) @ (y - pf) <= 1e-6


# ----------------------------------------------------------------------------- structure


@pytest.mark.parametrize("prox", all_kinds(), ids=lambda p: p.name)
def test_firmly_nonexpansive(prox):
    rng = np.random.default_rng(9)
    for i in range(20):
        x, y = params(100 + i, scale=rng.uniform(0.1, 3)), params(200 + i, scale=rng.uniform(0.1, 3))
        eta = float(rng.uniform(0.1, 2))
        px, py = flat(prox(x, eta)), flat(prox(y, eta))
        d, dp = flat(x) - flat(y), px - py
        assert np.linalg.norm(dp) <= np.linalg.norm(d) * (1 + 1e-6) + 1e-6
        assert dp @ dp <= dp @ d + 1e-5  # firm: ||Px - Py||^2 <= <Px - Py, x - y>


@pytest.mark.parametrize("prox", all_kinds(), ids=lambda p: p.name)
def test_output_contract(prox):
    w = params(10)
    w["fc.bias"] = w["fc.bias"].astype(np.float64)  # any float dtype in, float32 out
    before = {k: v.copy() for k, v in w.items()}
    out = prox(w, 0.5)
    assert isinstance(prox, Prox) and prox.name in PROX_KINDS
    assert list(out) == list(w)
    for k in w:
        assert out[k].dtype == np.float32 and out[k].shape == w[k].shape
        assert out[k] is not w[k]
        np.testing.assert_array_equal(w[k], before[k])  # input untouched
    out["fc.weight"][:] = 123.0  # the result does not alias the input
    np.testing.assert_array_equal(w["fc.weight"], before["fc.weight"])


# ----------------------------------------------------------------------------- values


def test_values():
    w = params(11)
    wf = flat(w)
    assert NoProx().value(w) == 0.0
    assert L1(0.6).value(w) == pytest.approx(0.6 * np.abs(wf).sum(), rel=1e-12)
    assert SquaredL2(0.9).value(w) == pytest.approx(0.45 * wf @ wf, rel=1e-12)
    assert ElasticNet(0.5, 0.8).value(w) == pytest.approx(0.5 * np.abs(wf).sum() + 0.4 * wf @ wf, rel=1e-12)
    assert GroupLasso(1.1).value(w) == pytest.approx(
        1.1 * sum(np.linalg.norm(wf[g]) for g in slices([[k] for k in SHAPES])), rel=1e-12)
    grp = [["fc.weight", "out.weight"]]
    assert GroupLasso(0.9, groups=grp).value(w) == pytest.approx(0.9 * np.linalg.norm(wf[slices(grp)[0]]), rel=1e-12)

    norm = np.linalg.norm(wf)
    assert L2Ball(norm * 1.01).value(w) == 0.0
    assert L2Ball(norm * 0.99).value(w) == math.inf
    ball = L2Ball(1.0)
    assert ball.value(ball(w, 1.0)) == 0.0  # float32 rounding of the projection is tolerated

    box = Box(-0.7, 0.4)
    assert box.value(w) == math.inf
    assert box.value(box(w, 1.0)) == 0.0
    assert Box(0.0, math.inf).value({"a": np.array([0.0, 5.0])}) == 0.0
    assert Box(0.0, math.inf).value({"a": np.array([-0.1, 5.0])}) == math.inf


def test_prox_value_decrease():
    """p = prox(z) minimises f1 + ||.-z||^2/(2 eta): no worse than z itself or random points."""
    rng = np.random.default_rng(12)
    z = params(12)
    zf = flat(z)
    for prox in all_kinds():
        eta = 0.7
        F = lambda w: prox.value(unflat(w)) + ((w - zf) ** 2).sum() / (2 * eta)  # noqa: E731
        fp = F(flat(prox(z, eta)))
        assert math.isfinite(fp)
        for _ in range(10):
            assert fp <= F(flat(prox(unflat(zf + 0.3 * rng.standard_normal(zf.size)), eta))) + 1e-5


def test_groups_leave_other_layers_alone():
    z = params(13)
    out = GroupLasso(0.5, groups=[["fc.weight"]])(z, 1.0)
    np.testing.assert_array_equal(out["fc.bias"], z["fc.bias"])
    np.testing.assert_array_equal(out["out.weight"], z["out.weight"])


# ----------------------------------------------------------------------------- gradient mapping


def test_gradient_mapping_no_prox_is_grad_norm():
    w, g = params(14), params(15)
    for eta in ETAS:
        assert gradient_mapping(w, g, NoProx(), eta) == pytest.approx(np.linalg.norm(flat(g)), rel=1e-9)
        vec = gradient_mapping_vector(w, g, NoProx(), eta)
        np.testing.assert_allclose(flat(vec), flat(g), atol=1e-6)


@pytest.mark.parametrize("eta", ETAS)
def test_gradient_mapping_zero_at_minimiser(eta):
    # f0 = 0.5||w - a||^2, f1 = lam||w||_1: the minimiser is soft(a, lam); grad f0 = w - a
    lam = 0.6
    a = flat(params(16))
    w = np.sign(a) * np.maximum(np.abs(a) - lam, 0)
    assert gradient_mapping(unflat(w), unflat(w - a), L1(lam), eta) < 1e-6
    # ... and not zero away from it
    w2 = w + 0.05
    assert gradient_mapping(unflat(w2), unflat(w2 - a), L1(lam), eta) > 1e-2


def test_gradient_mapping_ball_constrained_minimiser():
    # f0 = 0.5||w - a||^2 with ||a|| > r, f1 = ball indicator: the minimiser is a * r/||a||
    a = flat(params(17))
    r = 0.5 * np.linalg.norm(a)
    w = a * r / np.linalg.norm(a)
    assert gradient_mapping(unflat(w), unflat(w - a), L2Ball(r), 0.9) < 1e-6


# ----------------------------------------------------------------------------- factory + validation


def test_make_prox_kinds():
    assert set(PROX_KINDS) == {"none", "l1", "l2", "elastic-net", "group-lasso", "l2-ball", "box"}
    assert make_prox("none") == NoProx()
    assert make_prox("l1", 0.3) == L1(0.3)
    assert make_prox("l2", 0.3) == SquaredL2(0.3)
    assert make_prox("elastic-net", 0.3, l2=0.2) == ElasticNet(0.3, 0.2)
    assert make_prox("group-lasso", 0.3) == GroupLasso(0.3)
    assert make_prox("group-lasso", 0.3, groups=[["a", "b"]]).groups == (("a", "b"),)
    assert make_prox("l2-ball", 2.0) == L2Ball(2.0)
    assert make_prox("box", 0.5) == Box(-0.5, 0.5)
    assert make_prox("box", lower=0.0, upper=1.0) == Box(0.0, 1.0)
    for kind in PROX_KINDS:
        extra = {"l2": 0.1} if kind == "elastic-net" else {}
        assert make_prox(kind, 1.0, **extra).name == kind


def _raises(param: str, fn, *args, **kw):
    with pytest.raises(ValueError, match=param) as e:
        fn(*args, **kw)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_bad_settings_raise_value_error_naming_parameter():
    msg = _raises("strength", L1, -0.1)
    assert "-0.1" in msg and "[0, inf)" in msg
    _raises("strength", SquaredL2, float("nan"))
    _raises("strength", L1, "1")
    _raises("strength", GroupLasso, -1.0)
    _raises("l1", ElasticNet, -1.0, 0.1)
    _raises("l2", ElasticNet, 0.1, -1.0)
    msg = _raises("radius", L2Ball, 0.0)
    assert "(0, inf)" in msg
    _raises("radius", L2Ball, -2.0)
    _raises("lower", Box, 1.0, 0.0)
    _raises("lower", Box, 0.5, 0.5)
    _raises("upper", Box, 0.0, float("nan"))
    _raises("groups", GroupLasso, 1.0, groups=[["a"], ["a", "b"]])
    _raises("groups", GroupLasso, 1.0, groups="a")
    _raises("groups", GroupLasso(1.0, groups=[["nope"]]), params(0), 1.0)
    _raises("kind", make_prox, "l3", 1.0)
    _raises("strength", make_prox, "l1", -1.0)
    _raises("strength", make_prox, "l2-ball", 0.0)
    _raises("lower", make_prox, "box", 0.0)  # default box [-0, 0] is empty
    _raises("foo", make_prox, "l1", 1.0, foo=2)
    _raises("l2", make_prox, "elastic-net", 1.0)


@pytest.mark.parametrize("prox", all_kinds(), ids=lambda p: p.name)
@pytest.mark.parametrize("eta", [0.0, -1.0, float("nan"), float("inf"), None])
def test_bad_eta(prox, eta):
    msg = _raises("eta", prox, params(0), eta)
    assert repr(eta) in msg
    _raises("eta", gradient_mapping, params(0), params(1), prox, eta)
