"""The model-family spec (model_specs/fun_asr_nano.json): prompt strings, options, tensor table."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

FAMILY = "fun_asr_nano"


@functools.cache
def load_spec(family: str = FAMILY) -> dict[str, Any]:
    """The family spec shipped with the package (a copy also lives in every GGUF we write)."""
    text = resources.files("fun_asr").joinpath("model_specs", f"{family}.json").read_text("utf-8")
    return json.loads(text)


def spec_text(family: str = FAMILY) -> str:
    """The spec as the exact JSON text shipped with the package."""
    return resources.files("fun_asr").joinpath("model_specs", f"{family}.json").read_text("utf-8")
