"""The README's tutorial and the docs' tutorial run as written (with 2 ranks)."""

import re
import runpy
from pathlib import Path

ROOT = Path(__file__).parents[1]


def run_code(code: str, tmp_path: Path) -> None:
    script = tmp_path / "tutorial.py"
    script.write_text(code.replace("synk.fork()", "synk.fork(2, backend='cpu')"))
    runpy.run_path(str(script), run_name="__main__")


def test_readme_tutorial(tmp_path):
    text = (ROOT / "README.md").read_text()
    run_code(re.findall(r"```python\n(.*?)```", text, re.S)[0], tmp_path)


def test_docs_tutorial(tmp_path):
    text = (ROOT / "docs" / "tutorial.rst").read_text()
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:   .*\n|\n)+)", text)
    assert len(blocks) > 3
    run_code("\n".join("\n".join(line[3:] for line in b.splitlines()) for b in blocks), tmp_path)
