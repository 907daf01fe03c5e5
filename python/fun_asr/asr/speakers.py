"""Which CAM++ speaker model a Session uses for ``diarize=True``, and where it came from.

In order: the ``speaker_model`` given (a GGUF, a FunASR/ModelScope CAM++ folder, a hub repo id, or a loaded
:class:`~fun_asr.speakers.native.SpeakerModel`); the CAM++ embedded in the model package
(``fun-asr-convert --speaker-model``); ``$FUN_ASR_SPEAKER_MODEL``; for a hub model, the hub's CAM++ (FunASR's
``cam++``: ``funasr/campplus``, ModelScope's ``iic/speech_campplus_sv_zh-cn_16k-common`` for a ModelScope model),
downloaded and converted once; one already in fun-asr's cache. Nothing found: a ValueError that names each way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SPEAKER_ENV = "FUN_ASR_SPEAKER_MODEL"
NO_SPEAKER_MODEL = (
    "{model}: speaker labels (diarize=True, --diarize, spk=true) need FunASR's CAM++ speaker model, and there is "
    "none: this model package embeds none (fun-asr-convert SRC --speaker-model DIR|GGUF), none was given "
    f"(speaker_model= / --speaker-model: a .gguf, a FunASR CAM++ folder or a hub repo id), ${SPEAKER_ENV} is not "
    "set and none is in fun-asr's cache"
)


def find_speaker_model(arg: Any, package: Path, model_arg: Any, from_hub: bool,
                       progress: bool) -> tuple[Any, str]:
    """The speaker model and its source (``"embedded"``, a path, a repo id, ``$FUN_ASR_SPEAKER_MODEL=...``)."""
    from fun_asr.converter.hub import MODELSCOPE, MODELSCOPE_SPEAKER_REPO, resolve_speaker_model
    from fun_asr.speakers.native import SpeakerModel

    if arg is None:
        raise ValueError(f"{package}: this Session was made with speaker_model=None, so it has no speaker labels; "
                         "leave speaker_model out (auto) or give one")
    if isinstance(arg, SpeakerModel):
        return arg, "given"
    if arg != "auto":
        return SpeakerModel.load(resolve_speaker_model(arg, download=True, progress=progress)), str(arg)
    if package.is_file():
        embedded = SpeakerModel.from_package(package)
        if embedded is not None:
            return embedded, "embedded"
    env = os.environ.get(SPEAKER_ENV, "").strip()
    if env:
        try:
            return SpeakerModel.load(resolve_speaker_model(env, download=True, progress=progress)), \
                f"{SPEAKER_ENV}={env}"
        except (OSError, ValueError) as exc:
            raise type(exc)(f"{SPEAKER_ENV}={env}: {exc}") from None
    hub_repo = MODELSCOPE + MODELSCOPE_SPEAKER_REPO if from_hub and str(model_arg).startswith(MODELSCOPE) else None
    try:
        path = resolve_speaker_model(hub_repo, download=from_hub, progress=progress)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{NO_SPEAKER_MODEL.format(model=package)}; the hub's CAM++ could not be had: {exc}"
                         ) from None
    if path is None:
        raise ValueError(NO_SPEAKER_MODEL.format(model=package))
    return SpeakerModel.load(path), str(path)


__all__ = ["NO_SPEAKER_MODEL", "SPEAKER_ENV", "find_speaker_model"]
