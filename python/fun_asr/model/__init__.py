"""The model's files and its native loading: checkpoint readers (Hugging Face safetensors; FunASR ``model.pt``
through the restricted unpickler), hyperparameters, the model spec, the table of tensor names, GGUF metadata,
and :func:`load_model` (a GGUF or a checkpoint -> ``fun_asr._core.Model``)."""

from __future__ import annotations

from fun_asr.model.native import load_model, model_metadata

__all__ = ["load_model", "model_metadata"]
