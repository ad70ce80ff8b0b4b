"""The planning core (remat/core) must not import JAX, so it stays testable in
milliseconds and usable without an accelerator stack."""

import ast
import pathlib

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
