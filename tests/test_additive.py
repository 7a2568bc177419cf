"""Additive noise mechanisms (shared/mechanisms/additive.py) against closed forms, direct sums, quadrature and
Monte Carlo with fixed seeds.

Reference formulas (optimal-unbiased paper, Appendix F):
* Laplace Lap(b), b = Δ/ε: Var = 2b²;  discrete Laplace DLap(Δ/ε): α = e^(-ε/Δ), Var = 2α/(1-α)²;
* discrete staircase (Definition 19): a(r) on 0 <= |i| < r, e^-ε a(r) on r <= |i| < Δ, decaying by e^-ε per Δ;
* continuous staircase (Definition 20): a(γ) on [0, γΔ), e^-ε a(γ) on [γΔ, Δ), decaying by e^-ε per Δ.

The reference implementations below are written from those definitions (normalized numerically, not with the
library's a(r) / a(γ)), so they check the library's normalizations too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from shared.errors import CertificationError, LabelDPError
from shared.mechanisms.additive import (
    AdditiveNoiseRandomizer,
    DiscreteLaplaceNoise,
    DiscreteStaircaseNoise,
    LaplaceNoise,
    StaircaseNoise,
    discrete_staircase_second_moments,
    laplace,
    staircase,
    staircase_second_moment,
)
from shared.mechanisms.finite import FiniteRandomizer
from shared.privacy import design_epsilon

EPSILONS = [0.1, 0.5, 1.0, 4.0, 8.0]
LOW, HIGH = 1, 52
DELTA = HIGH - LOW  # 51
Z_TOL = 5.0  # fixed seeds; 5 standard errors keeps the tests robust to the seed yet tight enough to catch errors


# -- independent reference distributions ---------------------------------------------------------------------

def window_for(eps: float, delta: int, nats: float = 45.0) -> np.ndarray:
    """Integers wide enough that the mass outside is below e^-nats (pmfs decay by e^-eps per delta)."""
    n = int(math.ceil(delta * nats / eps)) + 2 * delta
    return np.arange(-n, n + 1)


def ref_dlap_pmf(alpha: float, k: np.ndarray) -> np.ndarray:
    w = alpha ** np.abs(k).astype(np.float64)
    return w / w.sum()  # normalized numerically on the window (outside mass is negligible)


def ref_dstair_pmf(eps: float, delta: int, r: int, k: np.ndarray) -> np.ndarray:
    """Definition 19, built as levels then normalized by summation (independent of the library's a(r))."""
    i = np.abs(k)
    period = i // delta
    offset = i - period * delta
    level = period + (offset >= r)
    w = np.exp(-eps * level.astype(np.float64))
    return w / w.sum()


def ref_stair_density(eps: float, delta: float, gamma: float):
    """Definition 20 with a(γ) obtained by integrating the unnormalized density in closed form."""
    b = math.exp(-eps)
    mass_one_side = sum(b**k * delta * (gamma + b * (1 - gamma)) for k in range(5000))
    a = 0.5 / mass_one_side

    def h(x):
        x = abs(x) / delta
        k = math.floor(x)
        return a * b ** (k + (x - k >= gamma))

    return h, a, b


def stair_moment_by_quad(eps, delta, gamma, power):
    """E[Z^power] (power even) of the continuous staircase, by quad over each constant piece."""
    h, a, b = ref_stair_density(eps, delta, gamma)
    total = 0.0
    k = 0
    while True:
        pieces = [(k * delta, (k + gamma) * delta), ((k + gamma) * delta, (k + 1) * delta)]
        contribution = 0.0
        for lo, hi in pieces:
            mid = 0.5 * (lo + hi)
            level = h(mid)
            contribution += level * integrate.quad(lambda x: x**power, lo, hi, epsabs=0, epsrel=1e-13)[0]
        total += contribution
        if k > 10 and contribution < 1e-17 * total:
            break
        k += 1
    return 2 * total


def mc_variance_tolerance(var: float, fourth: float, n: int) -> float:
    """Z_TOL standard errors of the sample variance of n iid draws with given 2nd and 4th central moments."""
    return Z_TOL * math.sqrt((fourth - var**2) / n)


# -- Laplace / discrete Laplace ------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("discrete", [False, True])
def test_laplace_certified_epsilon_close_to_requested(eps, discrete):
    m = laplace(LOW, HIGH, eps, discrete=discrete)
    assert isinstance(m, AdditiveNoiseRandomizer)
    assert m.certified_epsilon == m.noise.privacy_loss(DELTA)
    assert m.certified_epsilon <= eps
    assert eps - m.certified_epsilon < 1e-6
    # scale is Δ/ε, and the privacy loss of Lap/DLap over a shift of Δ is Δ/scale
    assert m.noise.scale == pytest.approx(DELTA / design_epsilon(eps), rel=1e-12)
    assert m.noise.scale == pytest.approx(DELTA / eps, rel=1e-7)
    assert m.certified_epsilon == pytest.approx(DELTA / m.noise.scale, rel=1e-12)


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_discrete_laplace_privacy_loss_brute_force(eps):
    noise = laplace(LOW, HIGH, eps, discrete=True).noise
    alpha = math.exp(-eps / DELTA)
    k = np.arange(-4 * DELTA, 4 * DELTA + 1)
    logp = np.log(ref_dlap_pmf(math.exp(-1 / noise.scale), k))
    worst = max(np.max(np.abs(logp[s:] - logp[:-s])) for s in range(1, DELTA + 1))
    assert noise.privacy_loss(DELTA) == pytest.approx(worst, abs=1e-9)
    assert worst == pytest.approx(-DELTA * math.log(alpha), abs=1e-8)


@pytest.mark.parametrize("eps", EPSILONS)
def test_laplace_variance_closed_form_and_quadrature(eps):
    noise = laplace(LOW, HIGH, eps).noise
    b = DELTA / design_epsilon(eps)
    assert noise.variance == pytest.approx(2 * b * b, rel=1e-12)
    assert noise.variance == pytest.approx(2 * (DELTA / eps) ** 2, rel=1e-7)
    # ∫ x² pdf(x) dx over both half-lines
    half = integrate.quad(lambda x: x * x * float(noise.pdf(x)), 0, np.inf, epsabs=0, epsrel=1e-12)[0]
    assert 2 * half == pytest.approx(noise.variance, rel=1e-9)


@pytest.mark.parametrize("eps", EPSILONS)
def test_discrete_laplace_variance_against_direct_sum(eps):
    noise = laplace(LOW, HIGH, eps, discrete=True).noise
    alpha = math.exp(-design_epsilon(eps) / DELTA)
    closed = 2 * alpha / (1 - alpha) ** 2
    k = window_for(eps, DELTA)
    pmf = noise.pmf(k)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_allclose(pmf, ref_dlap_pmf(alpha, k), rtol=1e-10, atol=0)
    direct = float(np.sum(k.astype(np.float64) ** 2 * pmf))
    assert noise.variance == pytest.approx(closed, rel=1e-10)
    assert direct == pytest.approx(closed, rel=1e-10)


@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_laplace_monte_carlo_moments(eps):
    n = 400_000
    noise = laplace(LOW, HIGH, eps).noise
    z = noise.sample(n, np.random.default_rng(1234))
    b = DELTA / design_epsilon(eps)
    var = 2 * b * b
    assert abs(z.mean()) < Z_TOL * math.sqrt(var / n)
    assert abs(z.var() - var) < mc_variance_tolerance(var, 24 * b**4, n)
    assert stats.kstest(z, lambda x: noise.cdf(x)).pvalue > 1e-3


@pytest.mark.parametrize("eps", [0.5, 1.0, 4.0])
def test_discrete_laplace_monte_carlo_moments(eps):
    n = 400_000
    noise = laplace(LOW, HIGH, eps, discrete=True).noise
    z = noise.sample(n, np.random.default_rng(99))
    assert np.all(z == np.round(z))
    k = window_for(eps, DELTA).astype(np.float64)
    pmf = noise.pmf(k)
    var, fourth = float(np.sum(k**2 * pmf)), float(np.sum(k**4 * pmf))
    assert abs(z.mean()) < Z_TOL * math.sqrt(var / n)
    assert abs(z.var() - var) < mc_variance_tolerance(var, fourth, n)


@pytest.mark.parametrize("scale", [0.7, 3.0, 25.5])
def test_discrete_laplace_upper_tail_direct_sum(scale):
    noise = DiscreteLaplaceNoise(scale)
    k = np.arange(-4000, 4001)
    pmf = noise.pmf(k)
    tail = np.cumsum(pmf[::-1])[::-1]  # tail[j] = Σ_{i >= k[j]} pmf(i)
    for t in range(-60, 61):
        assert noise.upper_tail(t) == pytest.approx(tail[t + 4000], abs=1e-13), t


# -- continuous staircase -------------------------------------------------------------------------------------

STAIR_PARAMS = [(0.1, 2.0, 0.5), (0.5, 1.0, 0.3), (1.0, 51.0, 0.42), (2.0, 3.0, 0.1), (4.0, 10.0, 0.9),
                (8.0, 0.25, 0.05)]


@pytest.mark.parametrize("eps,delta,gamma", STAIR_PARAMS)
def test_staircase_second_moment_against_quadrature(eps, delta, gamma):
    by_quad = stair_moment_by_quad(eps, delta, gamma, 2)
    assert staircase_second_moment(eps, delta, gamma) == pytest.approx(by_quad, rel=1e-10)
    assert StaircaseNoise(eps, delta, gamma).variance == pytest.approx(by_quad, rel=1e-10)


@pytest.mark.parametrize("eps,delta,gamma", STAIR_PARAMS)
def test_staircase_pdf_matches_definition_20(eps, delta, gamma):
    noise = StaircaseNoise(eps, delta, gamma)
    h, a, _ = ref_stair_density(eps, delta, gamma)
    assert noise._a == pytest.approx(a, rel=1e-12)
    xs = np.linspace(-5.3 * delta, 5.3 * delta, 1001)
    np.testing.assert_allclose(noise.pdf(xs), [h(x) for x in xs], rtol=1e-12)


@pytest.mark.parametrize("eps,delta,gamma", STAIR_PARAMS)
def test_staircase_cdf_against_integrated_pdf(eps, delta, gamma):
    noise = StaircaseNoise(eps, delta, gamma)
    assert float(noise.cdf(0.0)) == pytest.approx(0.5, abs=1e-14)
    for x in np.linspace(-4.7 * delta, 4.7 * delta, 37):
        kinks = [s * (k + o) * delta for k in range(6) for o in (0.0, gamma) for s in (-1, 1)]
        points = [p for p in kinks if min(0, x) < p < max(0, x)] or None
        piece = integrate.quad(lambda z: float(noise.pdf(z)), 0.0, x, points=points, epsabs=1e-15, limit=200)[0]
        assert float(noise.cdf(x)) == pytest.approx(0.5 + piece, abs=1e-12), x
    # far tail: the closed-form tail equals the integrated mass beyond t, piece by piece
    t = 3.2 * delta
    last = 4 + int(42 / eps)  # b**last < 1e-18
    edges = [t] + sorted(p for p in ((k + o) * delta for k in range(3, last) for o in (0.0, gamma)) if p > t)
    mass = math.fsum(integrate.quad(lambda z: float(noise.pdf(z)), lo, hi, epsabs=0, epsrel=1e-12)[0]
                     for lo, hi in zip(edges[:-1], edges[1:], strict=True))
    assert 1 - float(noise.cdf(t)) == pytest.approx(mass, rel=1e-9)
    assert float(noise.cdf(-t)) == pytest.approx(mass, rel=1e-9)


def test_laplace_cdf_against_integrated_pdf():
    noise = LaplaceNoise(3.5)
    for x in np.linspace(-20, 20, 41):
        pdf = lambda z: float(noise.pdf(z))  # noqa: E731
        val = integrate.quad(pdf, -np.inf, min(x, 0.0), epsabs=0, epsrel=1e-13)[0]
        if x > 0:
            val += integrate.quad(pdf, 0.0, x, epsabs=0, epsrel=1e-13)[0]
        assert float(noise.cdf(x)) == pytest.approx(val, abs=1e-10)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
def test_optimal_gamma_minimizes_variance(eps):
    m = staircase(LOW, HIGH, eps)
    noise = m.noise
    grid = np.linspace(1e-4, 1 - 1e-4, 9999)
    variances = np.array([staircase_second_moment(noise.epsilon, DELTA, g) for g in grid])
    best = int(np.argmin(variances))
    assert noise.variance <= variances.min() * (1 + 1e-12)
    assert abs(noise.gamma - grid[best]) <= 2e-4
    # Geng & Viswanath's closed-form optimal γ for the quadratic cost
    b = math.exp(-noise.epsilon)
    gv = -b / (1 - b) + (b - 2 * b * b + 2 * b**4 - b**5) ** (1 / 3) / (2 ** (1 / 3) * (1 - b) ** 2)
    assert noise.gamma == pytest.approx(gv, abs=1e-6)


@pytest.mark.parametrize("eps", EPSILONS)
def test_staircase_certified_epsilon(eps):
    for discrete in (False, True):
        m = staircase(LOW, HIGH, eps, discrete=discrete)
        assert m.certified_epsilon <= eps
        assert eps - m.certified_epsilon < 1e-6


@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_continuous_staircase_monte_carlo(eps):
    n = 400_000
    noise = staircase(LOW, HIGH, eps).noise
    z = noise.sample(n, np.random.default_rng(2024))
    var = stair_moment_by_quad(noise.epsilon, DELTA, noise.gamma, 2)
    fourth = stair_moment_by_quad(noise.epsilon, DELTA, noise.gamma, 4)
    assert abs(z.mean()) < Z_TOL * math.sqrt(var / n)
    assert abs(z.var() - var) < mc_variance_tolerance(var, fourth, n)
    assert stats.kstest(z, lambda x: noise.cdf(x)).pvalue > 1e-3


# -- discrete staircase ---------------------------------------------------------------------------------------

DSTAIR_PARAMS = [(0.1, 2), (0.5, 51), (1.0, 10), (4.0, 7), (8.0, 3), (2.0, 1)]


@pytest.mark.parametrize("eps,delta", DSTAIR_PARAMS)
def test_discrete_staircase_second_moments_against_direct_sum(eps, delta):
    closed = discrete_staircase_second_moments(eps, delta)
    assert closed.shape == (delta,)
    k = window_for(eps, delta)
    kf = k.astype(np.float64)
    for r in range(1, delta + 1):
        direct = float(np.sum(kf**2 * ref_dstair_pmf(eps, delta, r, k)))
        assert closed[r - 1] == pytest.approx(direct, rel=1e-10), r
        assert DiscreteStaircaseNoise(eps, delta, r).variance == pytest.approx(direct, rel=1e-10)


@pytest.mark.parametrize("eps,delta", DSTAIR_PARAMS)
def test_discrete_staircase_pmf_normalized_and_matches_definition_19(eps, delta):
    k = window_for(eps, delta)
    for r in sorted({1, max(1, delta // 2), delta}):
        noise = DiscreteStaircaseNoise(eps, delta, r)
        pmf = noise.pmf(k)
        assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
        np.testing.assert_allclose(pmf, ref_dstair_pmf(eps, delta, r, k), rtol=1e-10, atol=1e-300)


@pytest.mark.parametrize("eps,delta", DSTAIR_PARAMS)
def test_discrete_staircase_upper_tail_direct_sum(eps, delta):
    k = window_for(eps, delta)
    origin = -int(k[0])
    for r in sorted({1, max(1, delta // 3), delta}):
        noise = DiscreteStaircaseNoise(eps, delta, r)
        tail = np.cumsum(ref_dstair_pmf(eps, delta, r, k)[::-1])[::-1]
        for t in range(-3 * delta - 2, 3 * delta + 3):
            assert noise.upper_tail(t) == pytest.approx(tail[t + origin], abs=1e-13), (r, t)


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
def test_discrete_staircase_r_is_brute_force_optimal(eps):
    noise = staircase(LOW, HIGH, eps, discrete=True).noise
    assert noise.sensitivity == DELTA
    k = window_for(eps, DELTA)
    kf = k.astype(np.float64)
    brute = [float(np.sum(kf**2 * ref_dstair_pmf(noise.epsilon, DELTA, r, k))) for r in range(1, DELTA + 1)]
    assert noise.r == int(np.argmin(brute)) + 1
    assert noise.variance == pytest.approx(min(brute), rel=1e-10)


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0])
def test_discrete_staircase_privacy_loss_brute_force(eps):
    noise = staircase(LOW, HIGH, eps, discrete=True).noise
    w = window_for(eps, DELTA)
    logp = np.log(ref_dstair_pmf(noise.epsilon, DELTA, noise.r, w)[np.abs(w) <= 5 * DELTA])
    worst = max(np.max(np.abs(logp[s:] - logp[:-s])) for s in range(1, DELTA + 1))
    assert worst == pytest.approx(noise.epsilon, abs=1e-9)
    assert noise.privacy_loss(DELTA) == pytest.approx(worst, abs=1e-9)


@pytest.mark.parametrize("eps", [1.0, 4.0])
def test_discrete_staircase_monte_carlo_moments(eps):
    n = 400_000
    noise = staircase(LOW, HIGH, eps, discrete=True).noise
    z = noise.sample(n, np.random.default_rng(7))
    assert np.all(z == np.round(z))
    k = window_for(eps, DELTA).astype(np.float64)
    pmf = noise.pmf(k.astype(np.int64))
    var, fourth = float(np.sum(k**2 * pmf)), float(np.sum(k**4 * pmf))
    assert abs(z.mean()) < Z_TOL * math.sqrt(var / n)
    assert abs(z.var() - var) < mc_variance_tolerance(var, fourth, n)


def _chisquare_against(samples: np.ndarray, pmf_fn, cutoff: int) -> float:
    """Chi-square p-value with bins -cutoff..cutoff plus the two tails."""
    n = samples.size
    k = np.arange(-cutoff, cutoff + 1)
    observed = np.concatenate([[np.sum(samples < -cutoff)],
                               np.bincount((samples[np.abs(samples) <= cutoff] + cutoff).astype(np.int64),
                                           minlength=k.size),
                               [np.sum(samples > cutoff)]])
    inner = pmf_fn(k)
    tail = (1 - inner.sum()) / 2
    expected = n * np.concatenate([[tail], inner, [tail]])
    assert expected.min() > 5
    return stats.chisquare(observed, expected).pvalue


def test_discrete_staircase_empirical_pmf_chisquare():
    noise = staircase(0, 5, 1.0, discrete=True).noise  # Δ = 5
    samples = noise.sample(200_000, np.random.default_rng(31337))
    wide = window_for(noise.epsilon, 5)

    def pmf_for(r):
        full = ref_dstair_pmf(noise.epsilon, 5, r, wide)
        return lambda k: full[k - wide[0]]

    assert _chisquare_against(samples, pmf_for(noise.r), 30) > 1e-3
    # the test has power: the neighbouring staircase parameters are rejected on the same samples
    for other in {max(1, noise.r - 1), min(5, noise.r + 1)} - {noise.r}:
        assert _chisquare_against(samples, pmf_for(other), 30) < 1e-6


# -- staircase vs Laplace -------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
def test_staircase_no_worse_than_laplace(eps):
    lap = 2 * (DELTA / eps) ** 2
    alpha = math.exp(-eps / DELTA)
    dlap = 2 * alpha / (1 - alpha) ** 2
    cont = staircase(LOW, HIGH, eps).noise.variance
    disc = staircase(LOW, HIGH, eps, discrete=True).noise.variance
    assert cont <= lap * (1 + 1e-8)
    assert disc <= dlap * (1 + 1e-8)
    if eps >= 2:
        assert cont < 0.9 * lap
        assert disc < 0.9 * dlap


# -- clipped discrete mechanisms (exact finite randomizers) ----------------------------------------------------

def _reference_clipped_matrix(pmf: np.ndarray, k: np.ndarray, low: int, high: int) -> np.ndarray:
    rows = []
    for y in range(low, high + 1):
        out = np.clip(y + k, low, high) - low
        rows.append(np.bincount(out, weights=pmf, minlength=high - low + 1))
    return np.array(rows)


def _reference_noise_pmf(fr: FiniteRandomizer, eps: float, k: np.ndarray) -> np.ndarray:
    params = fr.parameters
    if params["noise"] == "DiscreteLaplaceNoise":
        assert params["scale"] == pytest.approx(DELTA / design_epsilon(eps), rel=1e-12)
        return ref_dlap_pmf(math.exp(-design_epsilon(eps) / DELTA), k)
    assert params["noise"] == "DiscreteStaircaseNoise"
    assert params["epsilon"] == design_epsilon(eps) and params["sensitivity"] == DELTA
    return ref_dstair_pmf(design_epsilon(eps), DELTA, params["r"], k)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("eps", EPSILONS)
def test_clipped_discrete_is_exact_clip_of_noise(family, eps):
    fr = family(LOW, HIGH, eps, discrete=True, clip=True)
    assert isinstance(fr, FiniteRandomizer)
    assert fr.counts.shape == (52, 52)
    assert all(int(s) == 2**53 for s in fr.counts.sum(axis=1))
    assert np.all(fr.counts >= 0)
    assert fr.certified_epsilon <= eps
    k = window_for(eps, DELTA)
    ref = _reference_clipped_matrix(_reference_noise_pmf(fr, eps, k), k, LOW, HIGH)
    np.testing.assert_allclose(fr.matrix, ref, rtol=0, atol=1e-12)
    # certified ε recomputed from the reference matrix (clipping is post-processing: ≤ ε)
    ratio = float(np.max(np.log(ref.max(axis=0)) - np.log(ref.min(axis=0))))
    assert fr.certified_epsilon == pytest.approx(ratio, abs=1e-9)
    # bias from the reference distribution; an interior label is pulled toward the middle
    ref_bias = ref @ np.arange(LOW, HIGH + 1) - np.arange(LOW, HIGH + 1)
    np.testing.assert_allclose(fr.bias, ref_bias, rtol=0, atol=1e-9)
    if eps <= 1:
        assert fr.bias[9] > 5.0  # label 10: clipping biases it upward by several units
        assert fr.bias[-10] < -5.0
    assert fr.bias[9] > 0 and fr.bias[9] == pytest.approx(-fr.bias[-10], abs=1e-9)


@pytest.mark.parametrize("family", [laplace, staircase])
def test_clipped_discrete_sampling_matches_matrix(family):
    fr = family(LOW, HIGH, 1.0, discrete=True, clip=True)
    n = 200_000
    out = fr.sample(np.full(n, 10.0), np.random.default_rng(5))
    freq = np.bincount(out.astype(np.int64) - LOW, minlength=52) / n
    p = fr.matrix[9]
    se = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(freq - p) <= Z_TOL * se + 1e-12)
    assert abs(out.mean() - 10 - fr.bias[9]) < Z_TOL * out.std() / math.sqrt(n)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("discrete", [False, True])
def test_unclipped_mechanisms_are_unbiased(family, discrete):
    eps = 0.5
    m = family(LOW, HIGH, eps, discrete=discrete, input_values=np.arange(LOW, HIGH + 1))
    np.testing.assert_array_equal(m.bias, np.zeros(52))
    np.testing.assert_allclose(m.squared_loss_per_label(), np.full(52, 0.5 * m.noise.variance), rtol=1e-12)
    n = 300_000
    labels = np.full(n, 10.0)
    out = m.sample(labels, np.random.default_rng(11))
    assert abs(np.mean(out - labels)) < Z_TOL * math.sqrt(m.noise.variance / n)
    # whereas clipping the same noise is visibly biased (many standard errors)
    clipped = np.clip(out, LOW, HIGH)
    assert np.mean(clipped - labels) > 20 * clipped.std() / math.sqrt(n)


# -- clipped continuous mechanisms ------------------------------------------------------------------------------

def _laplace_clipped_closed_form(b: float, lo: float, hi: float) -> tuple[float, float]:
    """(E[clip(Z, lo, hi)], E[clip(Z, lo, hi)²]) for Z ~ Lap(b), lo <= 0 <= hi."""
    mean = 0.5 * b * (math.exp(lo / b) - math.exp(-hi / b))
    second = 2 * b * b - math.exp(-hi / b) * (b * hi + b * b) - math.exp(lo / b) * (b * -lo + b * b)
    return mean, second


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_clipped_laplace_bias_and_loss_closed_form(eps):
    values = np.array([0.0, 1.0, 2.5, 5.0, 9.0, 10.0])
    m = laplace(0, 10, eps, clip=True, input_values=values)
    b = m.noise.scale
    expected = [_laplace_clipped_closed_form(b, 0 - y, 10 - y) for y in values]
    np.testing.assert_allclose(m.bias, [e[0] for e in expected], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(m.squared_loss_per_label(), [0.5 * e[1] for e in expected], rtol=1e-8)
    assert m.bias[0] > 0 and m.bias[-1] < 0 and abs(m.bias[3]) < 1e-9
    assert m.max_abs_bias == pytest.approx(np.max(np.abs([e[0] for e in expected])), rel=1e-8)


@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_clipped_continuous_bias_and_loss_monte_carlo(family, eps):
    values = np.array([0.0, 1.0, 2.5, 5.0, 9.0, 10.0])
    m = family(0, 10, eps, clip=True, input_values=values)
    bias, loss = m.bias, m.squared_loss_per_label()
    rng = np.random.default_rng(4242)
    n = 200_000
    for i, y in enumerate(values):
        err = m.sample(np.full(n, y), rng) - y
        assert np.all((y + err >= 0) & (y + err <= 10))
        assert abs(err.mean() - bias[i]) < Z_TOL * err.std() / math.sqrt(n), (y, err.mean(), bias[i])
        half_sq = 0.5 * err**2
        assert abs(half_sq.mean() - loss[i]) < Z_TOL * half_sq.std() / math.sqrt(n), (y, half_sq.mean(), loss[i])
    # clipping genuinely moves the interior labels near the ends, and the loss is below the unclipped Var/2
    assert bias[1] > 0.1 and bias[4] < -0.1
    assert np.all(loss < 0.5 * m.noise.variance)


def test_noisy_label_loss_is_prior_weighted_loss():
    values = np.array([0.0, 2.5, 5.0, 10.0])
    m = staircase(0, 10, 1.0, clip=True, input_values=values)
    prior = np.array([1.0, 2.0, 3.0, 4.0])
    assert m.noisy_label_loss(prior) == pytest.approx(float(prior @ m.squared_loss_per_label()) / 10, rel=1e-12)


# -- labels out of range ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", [laplace, staircase])
@pytest.mark.parametrize("discrete", [False, True])
@pytest.mark.parametrize("clip", [False, True])
def test_sampling_out_of_range_labels_raises(family, discrete, clip):
    m = family(LOW, HIGH, 1.0, discrete=discrete, clip=clip)
    rng = np.random.default_rng(0)
    out = m.sample(np.array([1.0, 52.0, 26.0]), rng)  # the boundary labels are fine
    assert out.shape == (3,)
    # the unclipped additive randomizers raise CertificationError; the clipped discrete ones are exact
    # FiniteRandomizers that reject labels outside their input set with LabelDPError (code label_out_of_domain)
    error = LabelDPError if (discrete and clip) else CertificationError
    for bad in ([0.0], [53.0], [1.0, 52.5], [np.nan], [-np.inf]):
        with pytest.raises(error):
            m.sample(np.array(bad), rng)

