#!/usr/bin/env python3
"""Writes a random-weight CAM++ speaker model in the ModelScope / FunASR layout. Needs torch and funasr 1.4.16.

    python tools/make_campplus_checkpoint.py OUT [--config tiny|full] [--seed 0]

The folder (as ``iic/speech_campplus_sv_zh-cn_16k-common`` / HF ``funasr/campplus`` ship it):

    config.yaml  configuration.json  campplus_cn_common.bin

The model is funasr 1.4.16's own ``CAMPPlus`` class built from ``model_conf``; the weights file is
``torch.save(model.state_dict())`` (a plain state_dict, as the release). ``--config full`` has the released
model's dimensions (feat_dim 80, embedding_size 192, growth_rate 32, bn_size 4, init_channels 128: 7.2 M
parameters), ``tiny`` narrow ones (same 52 layers, same FCM head) for fast tests.

The batch norms get non-trivial statistics: their affine weights and biases are drawn at random (conv
biases too), then their running mean/variance are measured in training mode on random mean-normalized
features (as training leaves them, so that every layer sees activations of a sane scale and the network is
as well conditioned as a trained one), then jittered a little. :func:`make_campplus_checkpoint`
is importable (tests).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "tiny": {"feat_dim": 80, "embedding_size": 32, "growth_rate": 8, "bn_size": 2, "init_channels": 16},
    "full": {"feat_dim": 80, "embedding_size": 192, "growth_rate": 32, "bn_size": 4, "init_channels": 128},
}

WEIGHTS = "campplus_cn_common.bin"


def campplus_class():  # noqa: ANN201 - funasr's CAMPPlus
    """funasr 1.4.16's CAMPPlus (its import prints notices about optional packages: silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        from funasr.models.campplus.model import CAMPPlus
    return CAMPPlus


def model_conf(config: str = "tiny", **overrides: Any) -> dict[str, Any]:
    if config not in CONFIGS:
        raise ValueError(f"unknown config {config!r}: accepted {', '.join(CONFIGS)}")
    return {**CONFIGS[config], "config_str": "batchnorm-relu", "memory_efficient": True, "output_level": "segment",
            **overrides}


def build_model(conf: dict[str, Any], seed: int = 0):  # noqa: ANN201 - CAMPPlus in eval mode
    """funasr's CAMPPlus of ``conf`` with random weights and calibrated, randomized batch norms."""
    import torch

    torch.manual_seed(seed)
    model = campplus_class()(**conf)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d)) and m.bias is not None:
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                if m.affine:
                    m.weight.copy_(torch.empty(m.weight.shape).uniform_(0.6, 1.4, generator=gen))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
                m.reset_running_stats()
                m.momentum = None  # cumulative average over the calibration batches
        # running statistics measured on random features with these weights (as training leaves them: every
        # batch norm sees its own inputs' statistics), so that activations keep a sane scale through the net
        model.train()
        efficient = [m for m in model.modules() if getattr(m, "memory_efficient", False)]
        for m in efficient:
            m.memory_efficient = False  # (gradient checkpointing: nothing to save without gradients)
        for _ in range(4):
            feats = torch.randn(4, 160, conf["feat_dim"], generator=gen) * 3.0
            model(feats - feats.mean(dim=1, keepdim=True))
        for m in efficient:
            m.memory_efficient = True
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.momentum = 0.1
                m.running_mean.add_(0.02 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.mul_(torch.empty(m.running_var.shape).uniform_(0.9, 1.1, generator=gen))
    return model.eval()


def make_campplus_checkpoint(out: str | Path, config: str = "tiny", seed: int = 0, **overrides: Any) -> Path:
    """Writes the folder ``out`` (config.yaml, configuration.json, campplus_cn_common.bin); returns it."""
    import torch
    import yaml

    conf = model_conf(config, **overrides)
    model = build_model(conf, seed)
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump({"model": "CAMPPlus", "model_conf": conf}, sort_keys=False),
                                      "utf-8")
    configuration = {
        "framework": "pytorch",
        "task": "speaker-verification",
        "model": {"type": "cam++-sv",
                  "model_config": {"sample_rate": 16000, "fbank_dim": conf["feat_dim"],
                                   "emb_size": conf["embedding_size"]},
                  "pretrained_model": WEIGHTS},
        "file_path_metas": {"init_param": WEIGHTS, "config": "config.yaml"},
    }
    (root / "configuration.json").write_text(json.dumps(configuration, indent=2), "utf-8")
    torch.save(model.state_dict(), root / WEIGHTS)
    return root


def load_reference(folder: str | Path):  # noqa: ANN201 - CAMPPlus in eval mode
    """funasr's CAMPPlus with the weights of a folder written here (or a real one), in eval mode."""
    import torch
    import yaml

    root = Path(folder)
    conf = yaml.safe_load((root / "config.yaml").read_text("utf-8"))["model_conf"]
    model = campplus_class()(**conf)
    model.load_state_dict(torch.load(root / WEIGHTS, map_location="cpu"))
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="folder to write")
    ap.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(make_campplus_checkpoint(args.out, args.config, args.seed))


if __name__ == "__main__":
    main()
