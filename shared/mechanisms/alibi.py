"""ALIBI's randomizer (Malek, Mironov, Prasad, Shilov & Tramèr, "Antipodes of Label Differential Privacy: PATE and
ALIBI", NeurIPS 2021; public code facebookresearch/label_dp_antipodes), made exact on integers.

The paper adds Laplace noise of scale b = 2/ε to each coordinate of the one-hot label e_y in ℝ^K (changing the label
moves two coordinates by 1: L1 sensitivity 2) and trains on the posterior Pr[y = k | ỹ] ∝ π_k Π_j exp(−|ỹ_j −
1[j=k]|/b) ∝ π_k exp((|ỹ_k| − |ỹ_k − 1|)/b): the coordinates j ≠ k cancel, so each class's log-likelihood is a
function of its own coordinate. Here the one-hot is scaled by an integer S (``SCALE``) and each coordinate gets
*discrete* Laplace noise (Pr[z] ∝ exp(−|z| s/t), sampled exactly from uniform integers by
:mod:`shared.mechanisms.integer_noise`) calibrated to sensitivity 2S: the released vector v = S e_y + Z is integer,
the ε certified is the exact rational 2S·s/t, and the log-likelihood of class k is (|v_k| − |v_k − S|)·s/t — the
continuous one at S → ∞, on 2S + 1 levels here.

The posterior is post-processing of v, with any prior: the trainer's ALIBI loss uses its model's current prediction
as the prior at every step (the paper's default, "mapwithprior"); :meth:`AlibiRandomizer.posterior` takes a fixed
one (uniform by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.domains import Classes
from shared.errors import CertificationError
from shared.mechanisms.events import LocalRandomizerDpEvent
from shared.mechanisms.finite import SAMPLING_CHUNK
from shared.mechanisms.integer_noise import DiscreteLaplace
from shared.privacy import check_epsilon

SCALE = 16  # S: the one-hot's integer scale (2S + 1 likelihood levels per class)


@dataclass(frozen=True)
class AlibiRandomizer:
    name = "alibi"
    num_classes: int
    epsilon: float
    noise: DiscreteLaplace  # per coordinate, calibrated to the sensitivity 2 * scale
    scale: int = SCALE

    @classmethod
    def build(cls, num_classes: int, epsilon: float, scale: int = SCALE) -> AlibiRandomizer:
        epsilon = check_epsilon(epsilon)
        return cls(int(num_classes), epsilon, DiscreteLaplace.calibrated(epsilon, 2 * scale), scale)

    @classmethod
    def from_description(cls, description: dict) -> AlibiRandomizer:
        """The randomizer a release describes, rebuilt from K, ε and S; its noise must be the described one, so
        that posteriors computed from it are those of the sampled vectors."""
        randomizer = cls.build(description["num_classes"], description["epsilon"], description["scale"])
        if randomizer.noise.describe() != description["noise"]:
            raise CertificationError("alibi: the described noise is not the one of K, epsilon and the scale")
        return randomizer

    def __post_init__(self):
        if self.certified_epsilon > self.epsilon:
            raise CertificationError(f"alibi: the sampled noise is {self.certified_epsilon}-DP, above {self.epsilon}")

    @property
    def certified_epsilon(self) -> float:
        return self.noise.certified_epsilon(2 * self.scale) if self.num_classes >= 2 else 0.0

    @property
    def num_outputs(self) -> None:
        return None  # integer vectors, unbounded

    def sample(self, labels, rng: np.random.Generator) -> np.ndarray:
        """The (n, K) integer vectors S·one_hot(y) + noise, ``SAMPLING_CHUNK`` labels at a time."""
        labels = Classes(self.num_classes).index_of(labels)
        released = np.empty((labels.size, self.num_classes), dtype=np.int64)
        for start in range(0, labels.size, SAMPLING_CHUNK):
            part = labels[start:start + SAMPLING_CHUNK]
            block = self.noise.sample(part.size * self.num_classes, rng).reshape(part.size, self.num_classes)
            block[np.arange(part.size), part] += self.scale
            released[start:start + part.size] = block
        return released

    def log_likelihoods(self, vectors) -> np.ndarray:
        """log Pr[v | y = k] up to a term free of k, per example and class: (|v_k| − |v_k − S|)·s/t."""
        v = np.asarray(vectors, dtype=np.float64)
        return (np.abs(v) - np.abs(v - self.scale)) * float(self.noise.epsilon(1))

    def posterior(self, vectors, prior=None) -> np.ndarray:
        """Pr[y = k | v] for each example under ``prior`` (uniform when None): the soft labels."""
        logits = self.log_likelihoods(vectors)
        if prior is not None:
            logits = logits + np.log(np.maximum(np.asarray(prior, dtype=np.float64), 1e-300))
        logits -= logits.max(axis=1, keepdims=True)
        weights = np.exp(logits)
        return weights / weights.sum(axis=1, keepdims=True)

    def dp_event(self) -> LocalRandomizerDpEvent:
        return LocalRandomizerDpEvent(mechanism=self.name, epsilon=self.certified_epsilon)

    def describe(self) -> dict:
        return {"mechanism": self.name, "epsilon": self.epsilon, "certified_epsilon": self.certified_epsilon,
                "num_classes": self.num_classes, "scale": self.scale, "noise": self.noise.describe()}
