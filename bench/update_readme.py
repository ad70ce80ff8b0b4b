"""Copies the benchmark tables from ``bench/results/*.md`` into ``bench/README.md``.

Each table goes between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``. A
results file's title (``# ...``) is dropped and its other headings become bold
lines, so that generated tables add no sections to the document's outline.
Run from the repository root: ``python -m bench.update_readme``.
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _demoted(line: str) -> str:
    """A markdown heading as a bold line; any other line unchanged."""
    if line.startswith("#"):
        return f"**{line.lstrip('#').strip()}**"
    return line


def update(readme: str, name: str, table: str) -> str:
    """``readme`` with the block for ``name`` replaced by ``table``."""
    pattern = re.compile(rf"(<!-- bench:{name} -->\n).*?(<!-- /bench:{name} -->)", re.S)
    if not pattern.search(readme):
        raise ValueError(f"bench/README.md has no <!-- bench:{name} --> block.")
    body = "\n".join(_demoted(line) for line in table.strip().splitlines()
                     if not line.startswith("# "))      # the results file's own title
    return pattern.sub(lambda m: m.group(1) + body.strip() + "\n" + m.group(2), readme)


def main() -> None:
    path = ROOT / "bench" / "README.md"
    text = path.read_text()
    for result in sorted((ROOT / "bench" / "results").glob("*.md")):
        if f"<!-- bench:{result.stem} -->" in text:
            text = update(text, result.stem, result.read_text())
    path.write_text(text)


if __name__ == "__main__":
    main()
