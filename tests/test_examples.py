"""The examples run and print what they promise (each in a fresh interpreter, as
a user runs them: ``python -m examples.NAME``)."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(module, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _losses(out):
    return [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("module, needs", [
    ("examples.flax_scan", ("flax", "optax")),
    ("examples.haiku_train", ("haiku", "optax")),
    ("examples.equinox_train", ("equinox", "optax")),
    ("examples.nnx_train", ("flax", "optax")),
])
def test_framework_example_trains(module, needs):
    for name in needs:
        pytest.importorskip(name)
    out = _run(module)
    losses = _losses(out)
    assert len(losses) == 3 and all(l == l for l in losses), out   # no NaN
    if "remat plan" in out:
        assert "(met)" in out, out
    if module in ("examples.equinox_train", "examples.nnx_train"):
        *_, theirs, ours = (float(line.split()[-2]) for line in out.splitlines()
                            if "XLA temp" in line)      # the framework's, then ours
        assert ours < theirs, out


def test_demo_plans_prints_progress_and_writes_its_picture(tmp_path):
    pytest.importorskip("optax")
    out = _run("examples.demo", "--out", str(tmp_path))
    progress = [line for line in out.splitlines() if "remat:" in line and "footprint" in line]
    assert progress and "(met)" in out, out
    png = tmp_path / "demo_memory.png"
    assert str(png.resolve()) in out and png.stat().st_size > 10_000
    assert "largest parameter difference" in out
