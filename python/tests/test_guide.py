"""The PyTorch guide's script is python/examples/pytorch_mnist.py, word for word, and at
most 60 lines (test_torch_mnist.py runs that file as written)."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_guide_shows_the_example_script_as_it_is() -> None:
    guide = (ROOT / "docs" / "guide" / "pytorch.md").read_text()
    script = (ROOT / "python" / "examples" / "pytorch_mnist.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    assert script in blocks, "docs/guide/pytorch.md must show python/examples/pytorch_mnist.py unchanged"
    assert len(script.splitlines()) <= 60
