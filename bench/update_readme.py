"""Copies the benchmark tables from ``bench/results/*.md`` into the README.

Each table goes between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``.
Run from the repository root: ``python -m bench.update_readme``.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def update(readme: str, name: str, table: str) -> str:
    """``readme`` with the block for ``name`` replaced by ``table``."""
    pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
    if not pattern.search(readme):
        raise ValueError(f"README has no <!-- bench:{name} --> block.")
    body = "\n".join(line for line in table.strip().splitlines()
                     if not line.startswith("# "))      # the results file's own title
    return pattern.sub(lambda m: m.group(1) + body.strip() + "\n" + m.group(2), readme)


def main() -> None:
    path = ROOT / "README.md"
    text = path.read_text()
    for result in sorted((ROOT / "bench" / "results").glob("*.md")):
        if f"<!-- bench:{result.stem} -->" in text:
            text = update(text, result.stem, result.read_text())
    path.write_text(text)


if __name__ == "__main__":
    main()
