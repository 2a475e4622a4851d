"""A GPU model's short name: the folder of its recorded data and tuning table (``data/<slug>/``), and of the
first-call search's cache."""

from __future__ import annotations

import re

_SLUG_DROP = {"nvidia", "tesla", "corporation"}


def gpu_slug(name: str | None) -> str:
    """A short, stable directory name for a GPU model.

    ``"NVIDIA H100 80GB HBM3"`` -> ``"h100-sxm-80gb"`` (HBM3 without "PCIe"/"NVL" is the SXM part),
    ``"NVIDIA H100 PCIe"`` -> ``"h100-pcie"``, ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100-sxm4-80gb"``,
    ``None``/``"cpu"`` -> ``"cpu"``. Deterministic: the same name always gives the same slug.
    """
    if name is None:
        return "cpu"
    if not isinstance(name, str):
        raise TypeError(f"gpu_slug: name must be a str or None, got {type(name).__name__}")
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _SLUG_DROP]
    if not words:
        raise ValueError(f"gpu_slug: cannot make a slug from GPU name {name!r}")
    memory = [w for w in words if re.fullmatch(r"\d+gb", w)]
    memory_kinds = {w for w in words if re.fullmatch(r"hbm\d*e?|gddr\d*x?", w)}
    form = [w for w in words if re.fullmatch(r"sxm\d*|pcie|nvl", w)]
    model = [w for w in words if w not in memory and w not in memory_kinds and w not in form]
    if not form and any(kind.startswith("hbm") for kind in memory_kinds):
        # "H100 80GB HBM3" is how the SXM module reports itself (the PCIe card says "PCIe").
        form = ["sxm"]
    return "-".join(model + form + memory) or "cpu"
