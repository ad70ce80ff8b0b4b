"""Saved residuals are logged (logger "remat", DEBUG) when a checkpoint is differentiated."""

import logging

import jax
import jax.numpy as jnp

import remat


def _f(w, x):
    return jnp.sum(jnp.tanh(jnp.tanh(x @ w) @ w))


def test_logged_at_debug(caplog):
    f = remat.checkpoint(_f, policy=remat.checkpoint_policies.dots_saveable)
    with caplog.at_level(logging.DEBUG, logger="remat"):
        jax.grad(f)(jnp.eye(3), jnp.ones((2, 3)))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "remat")
    assert "saves 4 residual(s)" in text
    assert "input f32[3,3]" in text and "input f32[2,3]" in text
    assert text.count("output of dot_general from") == 2


def test_silent_by_default(caplog):
    with caplog.at_level(logging.INFO, logger="remat"):
        jax.grad(remat.checkpoint(_f))(jnp.eye(3), jnp.ones((2, 3)))
    assert not [r for r in caplog.records if r.name == "remat"]
