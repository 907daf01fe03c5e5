"""The module paths of earlier layouts, still importable: the flat one (``fun_asr.session``, ``fun_asr.vad``'s one
file, ...) and the server's one module per protocol (``fun_asr.serve.ws_realtime``, ...). Each old name loads its
new module (with a DeprecationWarning naming it), so code written against them keeps working. New code imports
the names from ``fun_asr`` or from the new modules."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "fun_asr.frontend": "fun_asr.audio.frontend",
    "fun_asr.segment": "fun_asr.audio.pauses",
    "fun_asr.checkpoint": "fun_asr.model.checkpoint",
    "fun_asr.funasr_checkpoint": "fun_asr.model.funasr_checkpoint",
    "fun_asr.torch_pickle": "fun_asr.model.torch_pickle",
    "fun_asr.hparams": "fun_asr.model.hparams",
    "fun_asr.spec": "fun_asr.model.spec",
    "fun_asr.tensor_names": "fun_asr.model.tensor_names",
    "fun_asr.hub": "fun_asr.converter.hub",
    "fun_asr.session": "fun_asr.asr.session",
    "fun_asr.prompt": "fun_asr.asr.prompt",
    "fun_asr.tokenizer": "fun_asr.asr.tokenizer",
    "fun_asr.ctc": "fun_asr.asr.ctc",
    "fun_asr.stream": "fun_asr.asr.stream",
    "fun_asr.formats": "fun_asr.asr.formats",
    "fun_asr.messages": "fun_asr.asr.messages",
    "fun_asr.server": "fun_asr.serve.app",
    "fun_asr.realtime": "fun_asr.serve.protocols.funasr_realtime",
    "fun_asr.serve.openai": "fun_asr.serve.protocols.openai",
    "fun_asr.serve.funasr_http": "fun_asr.serve.protocols.funasr_http",
    "fun_asr.serve.ws_realtime": "fun_asr.serve.protocols.funasr_realtime",
    "fun_asr.serve.ws_2pass": "fun_asr.serve.protocols.funasr_runtime",
    "fun_asr.serve.web": "fun_asr.serve.protocols.web",
    "fun_asr.serve.batcher": "fun_asr.serve.core.batcher",
    "fun_asr.serve.errors": "fun_asr.serve.core.errors",
    "fun_asr.batch": "fun_asr.jobs.batch",
    "fun_asr.evaluate": "fun_asr.jobs.evaluate",
}


class _Loader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec):  # noqa: ANN201
        return importlib.import_module(self.target)

    def exec_module(self, module: object) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None):  # noqa: ANN201, ARG002
        new = MOVED.get(name)
        if new is None:
            return None
        warnings.warn(f"{name} moved to {new} (the names exported by fun_asr are unchanged)", DeprecationWarning,
                      stacklevel=3)
        return importlib.util.spec_from_loader(name, _Loader(new))


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
