"""Which ggml type each tensor is stored in, per package type (docs/model.md, GGUF package).

- norms, biases and the FSMN kernel: always F32;
- f32 / f16 / q8_0: every matrix (and the embedding) takes that type;
- q4_k_m: Q4_K, with Q6_K for the token embedding / output (and the CTC output layer) and for the
  attn_v and ffn_down matrices of the layers llama.cpp's ``use_more_bits`` rule picks (first and last
  eighth of a stack, and every third layer between), applied to each stack (encoder, adaptor,
  decoder, CTC head) with that stack's layer count;
- a matrix whose row length is not a multiple of its type's block size (the 560-wide layer-0
  q/k/v in Q8_0/Q4_K) falls back to F16, and the fallback is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from fun_asr import _core
from fun_asr.model.hparams import HParams
from fun_asr.model.metadata import FILE_TYPE  # noqa: F401 - re-exported
from fun_asr.model.tensor_names import TensorEntry

PACKAGE_TYPES = ("f32", "f16", "q8_0", "q4_k_m")

# gguf.LlamaFileType values for general.file_type


@dataclass(frozen=True)
class Placement:
    entry: TensorEntry
    type: str  # ggml type name as _core.quantize takes it
    wanted: str  # what the rule asked for before any fallback

    @property
    def fell_back(self) -> bool:
        return self.type != self.wanted


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers of a stack get the higher-precision type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def check_package_type(package: str) -> str:
    key = package.lower()
    if key not in PACKAGE_TYPES:
        raise ValueError(f"unknown package type {package!r}: accepted types are {', '.join(PACKAGE_TYPES)}")
    return key


def _layers_in_stack(hp: HParams, stack: str) -> int:
    return {"enc": hp.encoder.n_layers, "adp": hp.adaptor.n_layers, "dec": hp.decoder.n_layers,
            "ctc": hp.ctc.n_layers if hp.ctc is not None else 0}[stack]


ENCODER_TYPES = ("f32", "f16", "q8_0", "q4_k", "q6_k")


def place(entry: TensorEntry, package: str, hp: HParams, encoder_type: str | None = None) -> Placement:
    """``encoder_type``: another type for the audio encoder's matrices than the package's (e.g. an F16
    encoder in a Q4_K_M package: the encoder is compute-bound, the decoder bandwidth-bound)."""
    package = check_package_type(package)
    if entry.kind in ("norm", "bias", "fsmn") or package == "f32":
        return Placement(entry, "f32", "f32")
    if encoder_type is not None and entry.stack == "enc" and entry.kind == "matrix":
        if encoder_type not in ENCODER_TYPES:
            raise ValueError(f"unknown encoder type {encoder_type!r}: accepted {', '.join(ENCODER_TYPES)}")
        wanted = encoder_type
        used = wanted if entry.shape[-1] % _core.block_size(wanted) == 0 else "f16"
        return Placement(entry, used, wanted)
    if package in ("f16", "q8_0"):
        wanted = package
    elif entry.kind in ("embedding", "output"):
        wanted = "q6_k"
    elif entry.layer is not None and entry.gguf.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(
        entry.layer, _layers_in_stack(hp, entry.stack)
    ):
        wanted = "q6_k"
    else:
        wanted = "q4_k"
    used = wanted if entry.shape[-1] % _core.block_size(wanted) == 0 else "f16"
    return Placement(entry, used, wanted)
