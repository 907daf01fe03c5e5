"""Where a Session's sub-models come from (the FSMN-VAD, the CAM++ speaker model), one order for every family:
the argument the user gave, the copy embedded in the model package, the family's environment variable, then the
hub (the model's own hub's copy, downloaded when allowed) or what fun-asr's and the hub's caches already hold.
Each family gives its :class:`~fun_asr.converter.hub.SubModel` record and how to load and what to do when none
is found (:func:`find_component`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fun_asr.converter.hub import SubModel, resolve_submodel

T = TypeVar("T")


def find_component(kind: SubModel, given: str | os.PathLike[str] | None, *, embedded: Callable[[], T | None],
                   env: str, hub_repo: str | None, download: bool, progress: bool, load: Callable[[Path], T],
                   missing: Callable[[Exception | None], tuple[T | None, str | None]]) -> tuple[T | None, str | None]:
    """The loaded sub-model and where it came from (the argument as given, ``"embedded"``, ``"ENV=value"`` or
    the path of the converted file). In order:

    1. ``given`` (a path, a hub repo id, ``modelscope:owner/name``): resolved, downloaded if needed, loaded;
       errors raise;
    2. ``embedded()``: the package's own copy, or None;
    3. ``$env``: as ``given``; errors raise, prefixed with ``ENV=value``;
    4. ``hub_repo`` (None: the family's default repo), downloaded only when ``download``, else what the caches
       hold. Nothing there (``missing(None)``) or an error resolving or loading it (``missing(exc)``) is the
       family's call: go on without one, or raise."""
    if given is not None:
        return load(_resolved(resolve_submodel(kind, given, download=True, progress=progress))), str(given)
    found = embedded()
    if found is not None:
        return found, "embedded"
    value = os.environ.get(env, "").strip()
    if value:
        try:
            return load(_resolved(resolve_submodel(kind, value, download=True, progress=progress))), f"{env}={value}"
        except (OSError, ValueError) as exc:
            raise type(exc)(f"{env}={value}: {exc}") from None
    try:
        path = resolve_submodel(kind, hub_repo, download=download, progress=progress)
        loaded = None if path is None else load(path)
    except (OSError, ValueError) as exc:
        return missing(exc)
    if path is None:  # outside the try: missing(None) may raise its own error, which is then said once
        return missing(None)
    return loaded, str(path)


def _resolved(path: Path | None) -> Path:
    """resolve_submodel with download=True gives a path or raises; never None."""
    if path is None:
        raise FileNotFoundError("no such model")
    return path
