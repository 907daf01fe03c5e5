"""config.yaml and configuration.json of a FunASR Fun-ASR-Nano folder: reading them (``${a.b}`` references
resolved, paths relative to the folder), and what they give: the hyperparameters (with the LLM's config.json),
the CTC head's parameters, and the prompt as FunASR builds it from them."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

from fun_asr.model.checkpoint import CheckpointError
from fun_asr.model.hparams import ConfigError, CtcParams, HParams, parse_hparams
from fun_asr.model.spec import load_spec
from fun_asr.model.tensor_names import tensor_table


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML file that must hold a mapping (CheckpointError naming the file otherwise)."""
    import yaml

    try:
        conf = yaml.safe_load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(f"{path}: cannot read ({exc})") from None
    if not isinstance(conf, dict):
        raise CheckpointError(f"{path}: not a YAML mapping")
    return conf



_INTERP = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


def lookup(conf: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted path (``dataset_conf.sys_prompt``), or None where a part is missing."""
    cur: Any = conf
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def resolve_interpolations(conf: dict[str, Any]) -> dict[str, Any]:
    """OmegaConf-style ``${a.b}`` references in string values, resolved against the config itself
    (a reference to a missing key is left as written)."""
    def fix(v: Any, depth: int = 0) -> Any:
        if isinstance(v, dict):
            return {k: fix(x, depth) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x, depth) for x in v]
        if isinstance(v, str) and depth < 8:
            m = _INTERP.fullmatch(v)
            if m:
                target = lookup(conf, m.group(1))
                return v if target is None else fix(target, depth + 1)
            return _INTERP.sub(lambda mm: str(lookup(conf, mm.group(1)) or mm.group(0)), v)
        return v

    return fix(conf)


def section(conf: dict[str, Any], name: str) -> dict[str, Any]:
    """A mapping of config.yaml (``audio_encoder_conf``, ...): {} when absent, CheckpointError when not a mapping."""
    v = conf.get(name)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise CheckpointError(f"config.yaml: {name} must be a mapping, got {type(v).__name__}")
    return v


def file_metas(root: Path) -> dict[str, Any]:
    """configuration.json of the folder ({} when absent or not an object)."""
    p = root / "configuration.json"
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{p}: not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def local_path(root: Path, value: Any) -> Path | None:
    """A path named in config.yaml / configuration.json: relative to the folder, or absolute (FunASR
    resolves configuration.json's file_path_metas against the folder)."""
    if not isinstance(value, str) or not value:
        return None
    p = Path(value)
    for cand in ((root / p) if not p.is_absolute() else p, root / p.name):
        if cand.exists():
            return cand
    return None



def _check(cond: bool, message: str) -> None:
    if not cond:
        raise CheckpointError(f"config.yaml: {message}")


def hparams_from_config(conf: dict[str, Any], llm_config: dict[str, Any], root: Path) -> HParams:
    """The hyperparameters of config.yaml and the LLM's config.json, in the HF config's terms; what FunASR allows
    but fun-asr's graph does not (another encoder, a frontend with other fbank options, ...) is a CheckpointError."""
    spec = load_spec()
    enc_name = conf.get("audio_encoder")
    _check(enc_name == "SenseVoiceEncoderSmall",
           f"audio_encoder {enc_name!r} is not supported (accepted: SenseVoiceEncoderSmall)")
    enc = section(conf, "audio_encoder_conf")
    _check(enc.get("hub") != "ms", "audio_encoder_conf.hub 'ms' (an encoder downloaded from another model) is not "
                                   "supported")
    _check(int(enc.get("sanm_shfit", 0) or 0) == 0, f"audio_encoder_conf.sanm_shfit {enc.get('sanm_shfit')} is not "
                                                    "supported (accepted: 0)")
    _check(enc.get("normalize_before", True) is True, "audio_encoder_conf.normalize_before must be true")
    _check(enc.get("selfattention_layer_type", "sanm") == "sanm",
           f"audio_encoder_conf.selfattention_layer_type {enc.get('selfattention_layer_type')!r} is not supported")
    num_blocks, tp_blocks = int(enc.get("num_blocks", 6)), int(enc.get("tp_blocks", 0))
    _check(num_blocks >= 1 and tp_blocks >= 1,
           f"audio_encoder_conf num_blocks {num_blocks} / tp_blocks {tp_blocks}: both must be >= 1 (with tp_blocks 0 "
           "FunASR applies after_norm and tp_norm back to back, which the tensor table cannot hold)")
    fe = section(conf, "frontend_conf")
    ours = spec["frontend"]
    _check(conf.get("frontend", "WavFrontend") == "WavFrontend",
           f"frontend {conf.get('frontend')!r} is not supported (accepted: WavFrontend)")
    for key, want in (("fs", ours["sample_rate"]), ("n_mels", ours["fbank"]["num_mel_bins"]),
                      ("frame_length", ours["fbank"]["frame_length_ms"]),
                      ("frame_shift", ours["fbank"]["frame_shift_ms"]), ("window", ours["fbank"]["window"]),
                      ("lfr_m", ours["lfr_m"]), ("lfr_n", ours["lfr_n"])):
        if key in fe:
            _check(fe[key] == want, f"frontend_conf.{key} is {fe[key]!r}; fun-asr's frontend has {want!r}")
    _check(not fe.get("cmvn_file"), "frontend_conf.cmvn_file is set; fun-asr's Fun-ASR-Nano frontend has no CMVN")

    adp_name = conf.get("audio_adaptor")
    _check(adp_name == "Transformer", f"audio_adaptor {adp_name!r} is not supported (accepted: Transformer)")
    adp = section(conf, "audio_adaptor_conf")
    llm_d = int(llm_config.get("hidden_size", 0))
    n_main = num_blocks
    config = {
        "audio_config": {
            "hidden_size": enc.get("output_size", 256),
            "num_attention_heads": enc.get("attention_heads", 4),
            "intermediate_size": enc.get("linear_units", 2048),
            "num_hidden_layers": n_main + tp_blocks,
            "num_timestamp_prediction_layers": tp_blocks,
            "fsmn_kernel_size": enc.get("kernel_size", 11),
            "num_mel_bins": fe.get("n_mels", ours["fbank"]["num_mel_bins"]),
            "num_stacked_frames": fe.get("lfr_m", ours["lfr_m"]),
            "max_position_embeddings": spec["limits"]["default_max_lfr_frames"] + 1,
            "layer_norm_eps": 1e-5,  # SenseVoice's LayerNorm is torch's default
        },
        "adaptor_config": {
            # FunASR sets llm_dim from the LLM and encoder_dim from the encoder; FFN is llm_dim // 4 and
            # the blocks' LayerNorm has eps 1e-12 (funasr.models.transformer.layer_norm)
            "hidden_size": llm_d,
            "projector_hidden_size": adp.get("ffn_dim", 2048),
            "num_attention_heads": adp.get("attention_heads", 8),
            "intermediate_size": llm_d // 4,
            "num_hidden_layers": adp.get("n_layer", 2),
            "downsample_rate": adp.get("downsample_rate", 2),
            "layer_norm_eps": spec["ctc"]["layer_norm_eps"],
        },
        "text_config": llm_config,
    }
    try:
        return parse_hparams(config)
    except ConfigError as exc:
        exc.source = "config.yaml / LLM config.json"  # the files a FunASR checkpoint's config comes from
        raise CheckpointError(f"{root}: {exc}") from None


def ctc_params(conf: dict[str, Any], hp: HParams, src: dict[str, Any]) -> tuple[CtcParams | None, str | None]:
    """The CTC head's parameters from config.yaml when model.pt (``src``: its tensors by name) has every CTC
    tensor; else (None, why there are no timestamps)."""
    ctc_names = sorted(n for n in src if n.startswith(("ctc_decoder.", "ctc.")))
    name = conf.get("ctc_decoder")
    if not name:
        if ctc_names:
            return None, (f"model.pt has {len(ctc_names)} CTC tensors but config.yaml names no ctc_decoder; "
                          "they are ignored (no timestamps)")
        return None, "config.yaml names no ctc_decoder and model.pt has no CTC tensors: no timestamps"
    if name != "Transformer":
        return None, f"config.yaml: ctc_decoder {name!r} is not supported (accepted: Transformer); no timestamps"
    c = section(conf, "ctc_decoder_conf")
    if int(c.get("downsample_rate", 2)) != 1:
        return None, (f"config.yaml: ctc_decoder_conf.downsample_rate {c.get('downsample_rate', 2)} is not "
                      "supported (accepted: 1); no timestamps")
    d = int(c.get("llm_dim", 4096))
    vocab = int(conf.get("ctc_vocab_size", 60515))
    blank = int(section(conf, "ctc_conf").get("blank_id", vocab - 1))
    params = CtcParams(d_model=d, proj=int(c.get("ffn_dim", 2048)), n_heads=int(c.get("attention_heads", 8)),
                       ffn=d // 4, n_layers=int(c.get("n_layer", 2)), vocab=vocab, blank_id=blank,
                       eps=float(load_spec()["ctc"]["layer_norm_eps"]), frame_ms=int(load_spec()["ctc"]["frame_ms"]))
    if d % params.n_heads or not 0 <= blank < vocab:
        return None, (f"config.yaml: ctc_decoder_conf / ctc_conf are inconsistent (llm_dim {d}, heads "
                      f"{params.n_heads}, blank_id {blank}, ctc_vocab_size {vocab}); no timestamps")
    expected = [e for e in tensor_table(HParams(hp.encoder, hp.adaptor, hp.decoder, params)) if e.stack == "ctc"]
    missing = [e.funasr for e in expected if e.funasr not in src]
    if missing:
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        return None, (f"model.pt lacks {len(missing)} of the {len(expected)} CTC tensors ({shown}); FunASR disables "
                      "timestamps for such a checkpoint, and so does fun-asr (text is unaffected)")
    return params, None



def prompt_from_config(conf: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """The spec's prompt, adjusted as FunASR's data_load_speech does from config.yaml: no halving of the
    audio length without use_low_frame_rate; no system turn with dataset_conf.sys_prompt false; the empty
    think block appended with dataset_conf.do_think false."""
    p = copy.deepcopy(spec["prompt"])
    if not section(conf, "audio_adaptor_conf").get("use_low_frame_rate", False):
        p["fake_token_len"] = dict(p["fake_token_len"], halvings=0)
    ds = section(conf, "dataset_conf")
    if ds.get("sys_prompt", True) is False:
        p["template"] = p["template"].replace("<|im_start|>system\n{system}<|im_end|>\n", "")
    if ds.get("do_think", True) is False:
        p["template"] += "<think>\n\n</think>\n\n"
    return p
