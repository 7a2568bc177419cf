"""Models as pure functions over explicit parameter pytrees: a linear/GLM model and an MLP, both over numeric
features plus one embedding table per categorical feature (index 0 = unseen category). Shared because the
parameters of a centrally trained model (LabelDP-Pro at the labels party) are applied by the features party."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class ModelSpec:
    num_numeric: int
    vocab_sizes: tuple[int, ...]
    embed_dim: int = 4
    hidden: tuple[int, ...] = (64, 32)  # () is the linear model
    output_dim: int = 1

    def to_dict(self) -> dict:
        return {"num_numeric": self.num_numeric, "vocab_sizes": list(self.vocab_sizes),
                "embed_dim": self.embed_dim, "hidden": list(self.hidden), "output_dim": self.output_dim}

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        return cls(data["num_numeric"], tuple(data["vocab_sizes"]), data["embed_dim"], tuple(data["hidden"]),
                   data["output_dim"])


def num_params(spec: ModelSpec) -> int:
    """How many numbers :func:`init_params` makes (embedding tables, then each layer's weights and biases)."""
    total, width = sum(spec.vocab_sizes) * spec.embed_dim, spec.num_numeric + spec.embed_dim * len(spec.vocab_sizes)
    for out in (*spec.hidden, spec.output_dim):
        total, width = total + width * out + out, out
    return total


def init_params(key: jax.Array, spec: ModelSpec) -> dict:
    keys = jax.random.split(key, len(spec.vocab_sizes) + len(spec.hidden) + 1)
    embeddings = [0.05 * jax.random.normal(k, (size, spec.embed_dim))
                  for k, size in zip(keys[: len(spec.vocab_sizes)], spec.vocab_sizes, strict=True)]
    width = spec.num_numeric + spec.embed_dim * len(spec.vocab_sizes)
    layers = []
    for k, out in zip(keys[len(spec.vocab_sizes):], (*spec.hidden, spec.output_dim), strict=True):
        layers.append({"w": jax.random.normal(k, (width, out)) * jnp.sqrt(2.0 / max(width, 1)),
                       "b": jnp.zeros(out)})
        width = out
    if not spec.hidden:  # a GLM starts at zero: the fit then depends on data only
        layers[-1]["w"] = jnp.zeros_like(layers[-1]["w"])
    return {"embeddings": embeddings, "layers": layers}


def apply(params: dict, numeric: jax.Array, categorical: jax.Array) -> jax.Array:
    parts = [numeric] + [table[categorical[:, i]] for i, table in enumerate(params["embeddings"])]
    h = jnp.concatenate(parts, axis=-1) if len(parts) > 1 else numeric
    for layer in params["layers"][:-1]:
        h = jax.nn.relu(h @ layer["w"] + layer["b"])
    return h @ params["layers"][-1]["w"] + params["layers"][-1]["b"]


def params_to_lists(params: dict) -> dict:
    """Parameters as JSON lists (how a centrally trained model leaves the labels party)."""
    return {"embeddings": [jnp.asarray(e).tolist() for e in params["embeddings"]],
            "layers": [{"w": jnp.asarray(layer["w"]).tolist(), "b": jnp.asarray(layer["b"]).tolist()}
                       for layer in params["layers"]]}


def params_from_lists(lists: dict) -> dict:
    """The inverse of :func:`params_to_lists`: a parameter pytree :func:`apply` takes."""
    array = lambda values: jnp.asarray(values, dtype=jnp.float32)  # noqa: E731
    return {"embeddings": [array(e) for e in lists["embeddings"]],
            "layers": [{"w": array(layer["w"]), "b": array(layer["b"])} for layer in lists["layers"]]}
