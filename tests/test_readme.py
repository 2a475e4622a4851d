"""The README a newcomer reads: short, the two commands, and a CPU example that runs exactly as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_is_short_and_names_the_two_commands():
    assert len(README.splitlines()) <= 150
    assert "make report" in README and "make test" in README
    assert "python3-venv" in README  # the prerequisite a fresh Debian machine lacks
    for doc in re.findall(r"\]\((docs/[^)]+)\)", README):
        assert (REPO / doc).is_file(), doc


def test_readme_states_the_special_values_semantics():
    text = " ".join(README.split())
    assert "A row with a NaN, a +inf, or all -inf logits gives a NaN loss and a NaN gradient row" in text
    for loss in ("cross-entropy from labels", "cross-entropy from logits", "forward KL", "reverse KL"):
        assert loss in text, loss


def test_readme_cpu_example_runs_as_written(tmp_path):
    """The first Python block, saved as a file and run in a fresh interpreter (it sets TRITON_INTERPRET itself)."""
    example = python_blocks(README)[0]
    assert 'os.environ["TRITON_INTERPRET"] = "1"' in example
    script = tmp_path / "example.py"
    script.write_text(example, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip() == "", done.stderr[-3000:]  # no warning either
    ours, reference = re.search(r"cross-entropy (\S+) \(float64 reference (\S+)\)", done.stdout).groups()
    assert ours == reference
    assert "reverse KL" in done.stdout and "x.grad (8, 1000)" in done.stdout
