"""The PyTorch guide's scripts are python/examples/pytorch_mnist.py (your own loop) and
pytorch_mnist_short.py (train_worker), word for word, each at most 60 lines
(test_torch_mnist.py runs both files as written)."""

from __future__ import annotations

import re

from conftest import ROOT


def test_the_guide_shows_the_example_script_as_it_is() -> None:
    guide = (ROOT / "docs" / "guide" / "pytorch.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", guide, flags=re.S)
    for name in ("pytorch_mnist.py", "pytorch_mnist_short.py"):
        script = (ROOT / "python" / "examples" / name).read_text()
        assert script in blocks, f"docs/guide/pytorch.md must show python/examples/{name} unchanged"
        assert len(script.splitlines()) <= 60
