"""The README's tutorial runs as written (with 2 ranks)."""

import re
import runpy
from pathlib import Path


def test_readme_tutorial(tmp_path):
    text = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    script = tmp_path / "tutorial.py"
    script.write_text(code.replace("synk.fork()", "synk.fork(2, backend='cpu')"))
    runpy.run_path(str(script), run_name="__main__")
