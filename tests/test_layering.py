"""The planning core (remat/core) must not import JAX, so it stays testable in
milliseconds and usable without an accelerator stack."""

import ast
import os
import pathlib
import subprocess
import sys

CORE = pathlib.Path(__file__).resolve().parent.parent / "remat" / "core"
FORBIDDEN = ("jax", "jaxlib")


def _imported_modules(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def test_core_imports_no_jax():
    files = sorted(CORE.rglob("*.py"))
    assert files, f"no python files found under {CORE}"
    offenders = [f"{path.relative_to(CORE.parent.parent)} imports {name}"
                 for path in files for name in _imported_modules(path)
                 if name.split(".")[0] in FORBIDDEN]
    assert not offenders, "remat/core must not import JAX:\n" + "\n".join(offenders)


def test_core_relative_imports_stay_inside_core():
    for path in sorted(CORE.rglob("*.py")):
        depth = len(path.relative_to(CORE).parts) - 1  # 0 for remat/core/x.py
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level <= depth + 1, (
                    f"{path} reaches outside remat/core with a relative import")


# Run with JAX made unimportable: every core module imports, a planner meets a
# limit on a small training chain, and the JAX-facing names say what they need.
_WITHOUT_JAX = r"""
import importlib, pkgutil, sys
sys.modules["jax"] = None          # `import jax` now raises ImportError
sys.modules["jaxlib"] = None
import remat.core
for info in pkgutil.walk_packages(remat.core.__path__, "remat.core."):
    importlib.import_module(info.name)
from remat.core.algorithms import get_algorithm
from remat.core.graph import GraphBuilder
from remat.core.options import RematOptions
from remat.core.scheduled import on_schedule
from remat.core.simulate import simulate

b = GraphBuilder()
x = b.add_input(4096)
acts = [x]
for i in range(6):                     # forward: each activation kept for backward
    (a,) = b.add_op(f"fwd{i}", [acts[-1]], [4096], flops=1000)
    acts.append(a)
(g,) = b.add_op("loss", [acts[-1]], [4])
for i in reversed(range(6)):           # backward reads the activation it needs
    (g,) = b.add_op(f"bwd{i}", [g, acts[i]], [4096], flops=2000)
graph = b.build(outputs=[g])
order = tuple(range(graph.num_ops))
base = simulate(graph, order)
fixed = base.input_bytes + base.output_bytes
limit = fixed + 6 * (base.peak_bytes - fixed) // 10
result = get_algorithm("path")(on_schedule(graph, order),
                              RematOptions(limit, "path", small_node_bytes=0))
assert result.met and result.timeline.peak_bytes < base.peak_bytes, (limit, result.timeline.peak_bytes)
assert result.extra_flops > 0

import remat
try:
    remat.jit
except ImportError as e:
    assert "needs JAX" in str(e), e
else:
    raise AssertionError("remat.jit without JAX did not raise")
assert not any(name.split(".")[0] == "jax" and mod is not None
               for name, mod in sys.modules.items())
print("ok")
"""


def test_core_imports_and_plans_without_jax():
    root = CORE.parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_JAX], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
