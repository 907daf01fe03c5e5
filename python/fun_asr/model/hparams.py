"""Hyperparameters of a Fun-ASR-Nano checkpoint, parsed and validated before anything is allocated.

Accepts the nested Transformers 5.23 ``config.json`` (``audio_config`` / ``adaptor_config`` /
``text_config``) and FunASR's flat names for the encoder and adaptor (``output_size``,
``attention_heads``, ``linear_units``, ``num_blocks``, ``tp_blocks``, ``kernel_size``;
``encoder_dim``, ``llm_dim``, ``ffn_dim``, ``n_layer``, ``attention_heads``). Every dimension used
anywhere comes from here; nothing is hard-coded.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


class ConfigError(ValueError):
    """A checkpoint config is missing a field or has an inconsistent dimension: ``detail`` says what, ``source`` the
    file it is about (``config.json``; a FunASR checkpoint's reader names its own files), ``str()`` both."""

    def __init__(self, detail: str, source: str = "config.json", sep: str = ": ") -> None:
        super().__init__(detail)
        self.detail, self.source, self.sep = detail, source, sep

    def __str__(self) -> str:
        return f"{self.source}{self.sep}{self.detail}"


@dataclass(frozen=True)
class EncoderParams:
    num_mel_bins: int
    num_stacked_frames: int
    d_model: int
    n_heads: int
    ffn: int
    n_layers: int
    n_tp_layers: int
    fsmn_kernel: int
    max_positions: int
    eps: float

    @property
    def input_size(self) -> int:
        return self.num_mel_bins * self.num_stacked_frames

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def norm_layers(self) -> tuple[int, ...]:
        """Layers followed by a final LayerNorm: after the main stack and after the last layer."""
        return tuple(sorted({self.n_layers - self.n_tp_layers - 1, self.n_layers - 1}))

    @property
    def max_frames(self) -> int:
        """Longest LFR sequence: positions start at 1, so the table's last row is frame T."""
        return self.max_positions - 1


@dataclass(frozen=True)
class AdaptorParams:
    d_model: int
    proj: int
    n_heads: int
    ffn: int
    n_layers: int
    eps: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class DecoderParams:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    tie_embeddings: bool


@dataclass(frozen=True)
class CtcParams:
    """FunASR's CTC head (ModelScope checkpoints): ctc_decoder (linear d_enc -> proj, ReLU, linear -> d_model,
    then n_layers pre-LN transformer blocks with FFN ``ffn``) and ctc.ctc_lo (d_model -> vocab)."""

    d_model: int
    proj: int
    n_heads: int
    ffn: int
    n_layers: int
    vocab: int
    blank_id: int
    eps: float
    frame_ms: int = 60


@dataclass(frozen=True)
class HParams:
    encoder: EncoderParams
    adaptor: AdaptorParams
    decoder: DecoderParams
    ctc: CtcParams | None = None  # only FunASR checkpoints with a complete CTC head

    def symbols(self, layer: int | None = None) -> dict[str, int]:
        """Values of the shape symbols used in the tensor table (model_specs)."""
        e, a, d = self.encoder, self.adaptor, self.decoder
        return {
            "enc_in": e.input_size if layer == 0 else e.d_model,
            "enc_d": e.d_model,
            "enc_ffn": e.ffn,
            "enc_fsmn_k": e.fsmn_kernel,
            "adp_d": a.d_model,
            "adp_proj": a.proj,
            "adp_ffn": a.ffn,
            "dec_d": d.d_model,
            "dec_q": d.n_heads * d.head_dim,
            "dec_kv": d.n_kv_heads * d.head_dim,
            "dec_head": d.head_dim,
            "dec_ffn": d.ffn,
            "dec_vocab": d.vocab,
            **({"ctc_d": self.ctc.d_model, "ctc_proj": self.ctc.proj, "ctc_ffn": self.ctc.ffn,
                "ctc_vocab": self.ctc.vocab} if self.ctc is not None else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pick(cfg: dict[str, Any], where: str, *names: str, default: Any = ...) -> Any:
    for name in names:
        if name in cfg and cfg[name] is not None:
            return cfg[name]
    if default is not ...:
        return default
    raise ConfigError(f"{where} has none of {', '.join(repr(n) for n in names)}")


def _int(value: Any, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):  # also inf and nan
        raise ConfigError(f"{where} must be an integer, got {value!r}")
    if int(value) < minimum:
        raise ConfigError(f"{where} must be >= {minimum}, got {value}")
    return int(value)


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if value <= 0:
        raise ConfigError(f"{where} must be > 0, got {value}")
    return float(value)


def _section(config: dict[str, Any], *names: str) -> dict[str, Any]:
    for name in names:
        sub = config.get(name)
        if isinstance(sub, dict):
            return sub
    raise ConfigError(
        f"has no {' / '.join(repr(n) for n in names)} section; expected a "
        "Fun-ASR-Nano config (Transformers FunAsrNanoConfig)", sep=" "
    )


def parse_hparams(config: dict[str, Any]) -> HParams:
    """Reads and validates the dimensions of a Fun-ASR-Nano ``config.json``."""
    if not isinstance(config, dict):
        raise ConfigError(f"must hold a JSON object, got {type(config).__name__}", sep=" ")
    model_type = config.get("model_type")
    if model_type not in (None, "fun_asr_nano"):
        raise ConfigError(f"model_type is {model_type!r}, expected 'fun_asr_nano'")
    encoder = _encoder_params(config)
    decoder = _decoder_params(config)
    adaptor = _adaptor_params(config, encoder)
    hp = HParams(encoder, adaptor, decoder)
    _validate(hp)
    return hp


def _encoder_params(config: dict[str, Any]) -> EncoderParams:
    """The audio encoder's dimensions (``audio_config``; FunASR: ``audio_encoder_conf``)."""
    ec = _section(config, "audio_config", "audio_encoder_conf", "encoder_config")
    w = "audio_config"
    n_layers = _int(_pick(ec, w, "num_hidden_layers", "num_layers"), f"{w}.num_hidden_layers", 1)
    if "num_hidden_layers" not in ec and "num_blocks" in ec:  # FunASR: num_blocks + tp_blocks
        n_layers = _int(ec["num_blocks"], f"{w}.num_blocks") + _int(
            ec.get("tp_blocks", 0), f"{w}.tp_blocks", 0
        )
    return EncoderParams(
        num_mel_bins=_int(_pick(ec, w, "num_mel_bins", "n_mels", default=80), f"{w}.num_mel_bins"),
        num_stacked_frames=_int(
            _pick(ec, w, "num_stacked_frames", "lfr_m", default=7), f"{w}.num_stacked_frames"
        ),
        d_model=_int(_pick(ec, w, "hidden_size", "output_size"), f"{w}.hidden_size"),
        n_heads=_int(_pick(ec, w, "num_attention_heads", "attention_heads"), f"{w}.num_attention_heads"),
        ffn=_int(_pick(ec, w, "intermediate_size", "linear_units"), f"{w}.intermediate_size"),
        n_layers=n_layers,
        n_tp_layers=_int(
            _pick(ec, w, "num_timestamp_prediction_layers", "tp_blocks", default=0),
            f"{w}.num_timestamp_prediction_layers",
            0,
        ),
        fsmn_kernel=_int(_pick(ec, w, "fsmn_kernel_size", "kernel_size", default=11), f"{w}.fsmn_kernel_size"),
        max_positions=_int(
            _pick(ec, w, "max_position_embeddings", default=2049), f"{w}.max_position_embeddings", 2
        ),
        eps=_float(_pick(ec, w, "layer_norm_eps", default=1e-5), f"{w}.layer_norm_eps"),
    )


def _decoder_params(config: dict[str, Any]) -> DecoderParams:
    """The LLM decoder's dimensions (``text_config``; FunASR: ``llm_conf``)."""
    tc = _section(config, "text_config", "llm_conf")
    w = "text_config"
    rope = tc.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"text_config.rope_parameters must be an object, got {rope!r:.60}")
    theta = rope.get("rope_theta", tc.get("rope_theta"))
    if theta is None:
        raise ConfigError("text_config has no rope_parameters.rope_theta / rope_theta")
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(
            f"text_config.rope_parameters.rope_type {rope.get('rope_type')!r} is not "
            "supported; accepted: 'default'"
        )
    d_model = _int(_pick(tc, w, "hidden_size"), f"{w}.hidden_size")
    n_heads = _int(_pick(tc, w, "num_attention_heads"), f"{w}.num_attention_heads")
    return DecoderParams(
        d_model=d_model,
        n_layers=_int(_pick(tc, w, "num_hidden_layers"), f"{w}.num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=_int(_pick(tc, w, "num_key_value_heads", default=n_heads), f"{w}.num_key_value_heads"),
        head_dim=_int(_pick(tc, w, "head_dim", default=d_model // n_heads), f"{w}.head_dim"),
        ffn=_int(_pick(tc, w, "intermediate_size"), f"{w}.intermediate_size"),
        vocab=_int(_pick(tc, w, "vocab_size"), f"{w}.vocab_size"),
        rms_eps=_float(_pick(tc, w, "rms_norm_eps", default=1e-6), f"{w}.rms_norm_eps"),
        rope_theta=_float(theta, f"{w}.rope_parameters.rope_theta"),
        max_positions=_int(_pick(tc, w, "max_position_embeddings", default=40960), f"{w}.max_position_embeddings"),
        tie_embeddings=bool(config.get("tie_word_embeddings", tc.get("tie_word_embeddings", True))),
    )


def _adaptor_params(config: dict[str, Any], encoder: EncoderParams) -> AdaptorParams:
    """The audio adaptor's dimensions (``adaptor_config``; FunASR: ``audio_adaptor_conf``), checked against the
    encoder's width."""
    ac = _section(config, "adaptor_config", "audio_adaptor_conf")
    w = "adaptor_config"
    adp_d = _int(_pick(ac, w, "hidden_size", "llm_dim"), f"{w}.hidden_size")
    adaptor = AdaptorParams(
        d_model=adp_d,
        proj=_int(_pick(ac, w, "projector_hidden_size", "ffn_dim"), f"{w}.projector_hidden_size"),
        n_heads=_int(_pick(ac, w, "num_attention_heads", "attention_heads"), f"{w}.num_attention_heads"),
        # FunASR fixes the adaptor-layer FFN at llm_dim // 4 and has no field for it.
        ffn=_int(_pick(ac, w, "intermediate_size", default=adp_d // 4), f"{w}.intermediate_size"),
        n_layers=_int(_pick(ac, w, "num_hidden_layers", "n_layer"), f"{w}.num_hidden_layers", 0),
        eps=_float(_pick(ac, w, "layer_norm_eps", default=1e-5), f"{w}.layer_norm_eps"),
    )
    if "encoder_dim" in ac and _int(ac["encoder_dim"], f"{w}.encoder_dim") != encoder.d_model:
        raise ConfigError(
            f"adaptor_config.encoder_dim {ac['encoder_dim']} != audio_config.hidden_size "
            f"{encoder.d_model}"
        )
    if _int(ac.get("downsample_rate", 1), f"{w}.downsample_rate") != 1:
        raise ConfigError(
            f"adaptor_config.downsample_rate {ac['downsample_rate']} is not supported; "
            "accepted: 1 (the Fun-ASR-Nano layout)"
        )
    return adaptor


# Plausibility bounds (the native loader has the same): far above any real model, low enough that the tensor
# table and everything sized from a config stay small before a single tensor has been checked.
MAX_DIM = 1 << 24
MAX_LAYERS = 4096


def _validate(hp: HParams) -> None:
    e, a, d = hp.encoder, hp.adaptor, hp.decoder
    problems = []
    for section, params in (("audio_config", e), ("adaptor_config", a), ("text_config", d)):
        for name, value in vars(params).items():
            if isinstance(value, int) and not isinstance(value, bool):
                bound = MAX_LAYERS if name in ("n_layers", "n_tp_layers") else MAX_DIM
                if value > bound:
                    problems.append(f"{section} {name} = {value} is implausibly large (at most {bound})")
    if e.d_model % e.n_heads:
        problems.append(f"audio_config.hidden_size {e.d_model} is not divisible by num_attention_heads {e.n_heads}")
    if e.n_tp_layers >= e.n_layers:
        problems.append(
            f"audio_config.num_timestamp_prediction_layers {e.n_tp_layers} must be < num_hidden_layers {e.n_layers}"
        )
    if e.fsmn_kernel % 2 == 0:
        problems.append(f"audio_config.fsmn_kernel_size {e.fsmn_kernel} must be odd")
    if e.input_size % 2:
        problems.append(f"audio_config input size {e.input_size} (mel bins x stacked frames) must be even")
    if a.d_model % a.n_heads:
        problems.append(f"adaptor_config.hidden_size {a.d_model} is not divisible by num_attention_heads {a.n_heads}")
    if a.d_model != d.d_model:
        problems.append(f"adaptor_config.hidden_size {a.d_model} != text_config.hidden_size {d.d_model}")
    if d.n_heads % d.n_kv_heads:
        problems.append(
            f"text_config.num_attention_heads {d.n_heads} is not a multiple of num_key_value_heads {d.n_kv_heads}"
        )
    if d.head_dim % 2:
        problems.append(f"text_config.head_dim {d.head_dim} must be even (RoPE)")
    if problems:
        raise ConfigError("; ".join(problems))
