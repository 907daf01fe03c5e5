"""FunASR 1.4.16's Fun-ASR-Nano as the reference for the FunASR-layout and CTC tests (test-only helper).

Besides what tests/funasr_ref.py installs (funasr 1.4.16 --no-deps, omegaconf, kaldiio, librosa,
lazy_loader), the Fun-ASR-Nano path imports ``six`` (funasr.metrics.common, via the SenseVoice encoder
module) and ``tiktoken`` (the CTC tokenizer):

    python -m pip install six==1.17.0 tiktoken==0.14.0

FunASR's timestamps call ``torchaudio.functional.forced_align``. torchaudio from PyPI does not load beside
torch 2.13 here (its wheels are CUDA builds of another torch: libc10_cuda.so is missing), so, when it cannot
be imported, :func:`torchaudio_shim` puts a stand-in ``torchaudio`` module in ``sys.modules`` for the
duration of the reference call only: its ``functional.forced_align`` is a line-by-line scalar transcription
of torchaudio's CPU kernel (``src/libtorchaudio/forced_align/cpu/compute.cpp``) and of its Python wrapper
(scores = log_probs gathered along the path), written independently of fun_asr.asr.ctc's vectorized version.
Everything else -- the CTC head, the tokenizer, the text clean-up, the grouping into tokens, the times --
is FunASR's own code. (funasr.utils.fbank chose its fbank backend at import, before the shim exists, so
the features stay kaldi-native-fbank's, as ours.)
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types
from functools import lru_cache
from typing import Any

import numpy as np


@lru_cache(maxsize=1)
def nano_reference_available() -> bool:
    from funasr_ref import funasr_available

    if not funasr_available():
        return False
    from importlib.util import find_spec

    return all(find_spec(m) is not None for m in ("six", "tiktoken", "transformers", "yaml"))


def _forced_align_scalar(log_probs, targets, blank: int):  # noqa: ANN001, ANN202 - torch tensors
    """torchaudio.functional.forced_align for batch 1, transcribed from the C++ CPU kernel."""
    import torch

    if blank in targets:
        raise ValueError(f"targets Tensor shouldn't contain blank index. Found {targets}.")
    if torch.max(targets) >= log_probs.shape[-1]:
        raise ValueError("targets values must be less than the CTC dimension")
    lp = log_probs[0].to(torch.float32).numpy()
    tg = [int(x) for x in targets[0].tolist()]
    T, L = lp.shape[0], len(tg)
    S = 2 * L + 1
    ninf = np.float32(-np.inf)
    alphas = [[ninf] * S, [ninf] * S]
    back = [[-1] * S for _ in range(T)]
    R = sum(1 for i in range(1, L) if tg[i] == tg[i - 1])
    if T < L + R:
        raise RuntimeError("targets length is too long for CTC")
    start = 0 if T - (L + R) > 0 else 1
    end = 1 if S == 1 else 2
    for i in range(start, end):
        label = blank if i % 2 == 0 else tg[i // 2]
        alphas[0][i] = np.float32(lp[0][label])
    for t in range(1, T):
        if T - t <= L + R:
            if start % 2 == 1 and tg[start // 2] != tg[start // 2 + 1]:
                start += 1
            start += 1
        if t <= L + R:
            if end % 2 == 0 and end < 2 * L and tg[end // 2 - 1] != tg[end // 2]:
                end += 1
            end += 1
        startloop = start
        cur, prev = t % 2, (t - 1) % 2
        for j in range(S):
            alphas[cur][j] = ninf
        if start == 0:
            alphas[cur][0] = np.float32(alphas[prev][0] + lp[t][blank])
            back[t][0] = 0
            startloop += 1
        for i in range(startloop, end):
            x0, x1, x2 = alphas[prev][i], alphas[prev][i - 1], ninf
            label = blank if i % 2 == 0 else tg[i // 2]
            if i % 2 != 0 and i != 1 and tg[i // 2] != tg[i // 2 - 1]:
                x2 = alphas[prev][i - 2]
            if x2 > x1 and x2 > x0:
                result, back[t][i] = x2, 2
            elif x1 > x0:
                result, back[t][i] = x1, 1
            else:
                result, back[t][i] = x0, 0
            alphas[cur][i] = np.float32(result + lp[t][label])
    idx1 = (T - 1) % 2
    ltr = S - 1 if alphas[idx1][S - 1] > alphas[idx1][S - 2] else S - 2
    path = [0] * T
    for t in range(T - 1, -1, -1):
        path[t] = blank if ltr % 2 == 0 else tg[ltr // 2]
        ltr -= back[t][ltr]
    paths = torch.tensor([path], dtype=targets.dtype)
    scores = log_probs[:, torch.arange(T), paths[0]]
    return paths, scores


@contextlib.contextmanager
def torchaudio_shim():  # noqa: ANN201
    """A ``torchaudio`` with ``functional.forced_align`` in sys.modules while the block runs, unless the
    real torchaudio imports (then that is used)."""
    try:
        import torchaudio.functional  # noqa: F401

        yield "torchaudio"
        return
    except Exception:  # noqa: BLE001 - absent, or its C extension does not load
        pass
    saved = {k: sys.modules[k] for k in list(sys.modules) if k == "torchaudio" or k.startswith("torchaudio.")}
    mod = types.ModuleType("torchaudio")
    mod.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    fn = types.ModuleType("torchaudio.functional")
    fn.__spec__ = importlib.machinery.ModuleSpec("torchaudio.functional", None)
    fn.forced_align = lambda log_probs, targets, blank=0: _forced_align_scalar(log_probs, targets, blank)
    mod.functional = fn
    sys.modules["torchaudio"], sys.modules["torchaudio.functional"] = mod, fn
    try:
        yield "shim"
    finally:
        for k in ("torchaudio", "torchaudio.functional"):
            sys.modules.pop(k, None)
        sys.modules.update(saved)


def funasr_transcribe(model_dir: str, samples: np.ndarray, **generate_kwargs: Any) -> dict[str, Any]:
    """FunASR's own ``AutoModel(model=dir).generate(input=[samples])`` on CPU, one thread, with what it
    computed on the way: ``{"result": its result dict (text, timestamps, ctc_timestamps, ...),
    "generated_ids": the LLM's new token ids, "ctc_log_probs": [T, V] float32 or None, "aligner": 'torchaudio' |
    'shim'}``."""
    import torch

    from funasr_ref import _isolated, automodel

    am = automodel(str(model_dir))
    m = am.model
    rec: dict[str, Any] = {"generated_ids": None, "ctc_log_probs": None}
    orig_generate = m.llm.generate
    orig_log_softmax = m.ctc.log_softmax if m.ctc is not None else None

    def generate(*args: Any, **kw: Any) -> Any:
        out = orig_generate(*args, **kw)
        rec["generated_ids"] = out[0].tolist()
        return out

    def log_softmax(x: Any) -> Any:
        out = orig_log_softmax(x)
        rec["ctc_log_probs"] = out[0].detach().float().numpy().copy()
        return out

    m.llm.generate = generate
    if orig_log_softmax is not None:
        m.ctc.log_softmax = log_softmax
    try:
        with _isolated(), torchaudio_shim() as aligner:
            res = am.generate(input=[torch.from_numpy(np.array(samples, dtype=np.float32))], **generate_kwargs)
    finally:
        del m.llm.generate
        if orig_log_softmax is not None:
            del m.ctc.log_softmax
    rec["result"] = res[0]
    rec["aligner"] = aligner
    return rec
