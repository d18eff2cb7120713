"""Curvature and gradient-noise probes of a loss, inside a compiled program.

``extreme_eigenvalues`` estimates the smallest and largest eigenvalues of the Hessian
of a loss with respect to its parameters by Lanczos iteration on Hessian-vector
products (forward-over-reverse autodiff), never forming the Hessian.
``gradient_noise`` estimates the two terms of McCandlish et al.'s (2018) gradient
noise scale from the gradients of equal minibatches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

PyTree = Any


def hessian_vector_product(loss: Callable[[PyTree], jax.Array], params: PyTree, vector: PyTree) -> PyTree:
    """``H v`` for the Hessian ``H`` of ``loss`` at ``params``: the forward derivative of
    the gradient along ``vector`` (forward-over-reverse)."""
    return jax.jvp(jax.grad(loss), (params,), (vector,))[1]


def lanczos(matvec: Callable[[jax.Array], jax.Array], start: jax.Array, iterations: int) -> jax.Array:
    """The ``iterations x iterations`` tridiagonal matrix of Lanczos iteration on the
    symmetric operator ``matvec`` from vector ``start``; its eigenvalues (Ritz values)
    approximate the operator's extreme eigenvalues first. Each new basis vector is
    orthogonalised against all earlier ones, twice, so rounding does not bring back
    converged directions."""
    basis = jnp.zeros((iterations, start.size), start.dtype).at[0].set(start / jnp.linalg.norm(start))
    tiny = jnp.finfo(start.dtype).tiny

    def body(j: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, ...]:
        basis, alphas, betas = carry
        w = matvec(basis[j])
        alphas = alphas.at[j].set(w @ basis[j])
        earlier = (jnp.arange(iterations) <= j)[:, None] * basis
        for _ in range(2):
            w = w - earlier.T @ (earlier @ w)
        beta = jnp.linalg.norm(w)
        betas = betas.at[j].set(beta)
        # past the operator's rank beta is 0 and the next vector is noise made orthogonal: its Ritz
        # values are still Rayleigh quotients of the operator, so the extremes stay right. (After the
        # last step the index is out of range and the write is dropped.)
        basis = basis.at[j + 1].set(w / jnp.maximum(beta, tiny))
        return basis, alphas, betas

    zeros = jnp.zeros(iterations, start.dtype)
    _, alphas, betas = jax.lax.fori_loop(0, iterations, body, (basis, zeros, zeros))
    return jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)


def extreme_eigenvalues(loss: Callable[[PyTree], jax.Array], params: PyTree, key: jax.Array,
                        iterations: int) -> tuple[jax.Array, jax.Array]:
    """``(lambda_min, lambda_max)`` of the Hessian of ``loss`` at ``params``, by
    ``iterations`` Lanczos steps from a random start drawn with ``key``."""
    flat, unravel = ravel_pytree(params)
    flat = flat.astype(jnp.float32)

    def matvec(v: jax.Array) -> jax.Array:
        return ravel_pytree(hessian_vector_product(loss, params, unravel(v.astype(flat.dtype))))[0].astype(jnp.float32)

    ritz = jnp.linalg.eigvalsh(lanczos(matvec, jax.random.normal(key, flat.shape), iterations))
    return ritz[0], ritz[-1]


def gradient_noise(grads: PyTree, minibatch_size: int) -> tuple[jax.Array, jax.Array]:
    """Unbiased estimates of ``|G|^2`` (the true gradient's squared norm) and ``tr(Sigma)``
    (the per-sample gradient covariance's trace) from ``grads``, the gradients of ``K >= 2``
    disjoint minibatches of ``minibatch_size`` samples stacked on a leading axis
    (McCandlish et al. 2018, appendix A: the small batch is one minibatch, the large one
    all ``K``). Their ratio ``tr(Sigma) / |G|^2`` is the simple noise scale: the batch size
    beyond which larger batches stop paying off."""
    flat = jax.vmap(lambda g: ravel_pytree(g)[0])(grads).astype(jnp.float32)
    count = flat.shape[0]
    small, big = minibatch_size, minibatch_size * count
    small_norm = jnp.mean(jnp.sum(flat**2, axis=1))
    big_norm = jnp.sum(jnp.mean(flat, axis=0) ** 2)
    true_norm = (big * big_norm - small * small_norm) / (big - small)
    trace = (small_norm - big_norm) / (1 / small - 1 / big)
    return true_norm, trace
