"""The Ray engine: Ray Data reads and decodes in CPU tasks, a pool of actors each holds one Session."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fun_asr.jobs.inputs import BatchError, Item
from fun_asr.jobs.local import JobOptions, Loaded, load, transcribe_loaded

log = logging.getLogger("fun_asr.batch")
_READ_TASK_MEMORY = 256 * 2**20  # bytes a Ray reading task reserves (decoded audio of one batch)
def _ray_read(batch: Any) -> Any:
    """Ray Data CPU task: reads and decodes a block of recordings."""
    import pyarrow as pa

    out: dict[str, list] = {"item": [], "samples": [], "warnings": [], "truncated": [], "load_ms": [], "error": []}
    for row in batch.to_pylist():
        ld = load(Item(**json.loads(row["item"])))
        out["item"].append(row["item"])
        out["samples"].append(ld.samples.tobytes() if ld.samples is not None else b"")
        out["warnings"].append(json.dumps(ld.warnings, ensure_ascii=False))
        out["truncated"].append(ld.truncated)
        out["load_ms"].append(ld.load_ms)
        out["error"].append(ld.error)
    return pa.table({"item": pa.array(out["item"], pa.string()), "samples": pa.array(out["samples"], pa.large_binary()),
                     "warnings": pa.array(out["warnings"], pa.string()), "truncated": pa.array(out["truncated"]),
                     "load_ms": pa.array(out["load_ms"], pa.float64()), "error": pa.array(out["error"], pa.string())})


def _item_json(item: Item) -> str:
    d = {"id": item.id, "audio": item.audio, "reference": item.reference, "language": item.language,
         "hotwords": None if item.hotwords is None else list(item.hotwords), "error": item.error}
    return json.dumps(d, ensure_ascii=False)


class RayTranscriber:
    """A Ray actor holding one Session; maps blocks of decoded audio to result records."""

    def __init__(self, model: str, device: str, threads: int, vad: str | None, vad_model: str | None,
                 options: dict, speaker_model: str | None = None) -> None:
        from fun_asr.asr.session import Session

        self.opts = JobOptions(**{**options, "hotwords": tuple(options["hotwords"])})
        self.session = Session(model, device=device, threads=threads, progress=False, vad=vad, vad_model=vad_model,
                               speaker_model=speaker_model or "auto")
        o = self.opts  # the job's own options must be valid: fail the job, not every item
        self.session.options(**o.transcription_options(o.language, o.hotwords))

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        loaded = []
        for row in batch.to_pylist():
            d = json.loads(row["item"])
            if d["hotwords"] is not None:
                d["hotwords"] = tuple(d["hotwords"])
            samples = np.frombuffer(row["samples"], np.float32) if row["error"] is None else None
            loaded.append(Loaded(Item(**d), samples, json.loads(row["warnings"]), bool(row["truncated"]),
                                 float(row["load_ms"]), row["error"]))
        records = transcribe_loaded(self.session, loaded, self.opts)
        return pa.table({"id": pa.array([r["id"] for r in records], pa.string()),
                         "record": pa.array([json.dumps(r, ensure_ascii=False) for r in records], pa.string())})


@dataclass
class RaySettings:
    address: str | None = None  # None: ray.init() (RAY_ADDRESS, else a local cluster); "auto"; "host:port"
    actors: int | None = None  # default: what the cluster's CPUs (or GPUs) allow
    threads_per_actor: int | None = None  # default 1 on a 2-CPU machine, up to 4
    read_cpus: float = 1.0  # CPUs reserved per reading task
    gpus_per_actor: float | None = None  # default 1 with a CUDA device


def ray_engine(todo: list[Item], session_args: dict[str, Any], opts: JobOptions, emit: Callable[[list[dict]], None],
                settings: RaySettings, progress: bool, stop: threading.Event | None = None) -> dict:
    """The items through a pool of Ray actors, each holding a Session made with ``session_args`` (``model``,
    ``device``, ``vad``, ``vad_model``, ``speaker_model``); returns what the summary says of the engine."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise BatchError("the Ray engine needs Ray Data: pip install 'fun-asr[ray]'") from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if settings.address:
            kwargs["address"] = settings.address
        ray.init(**kwargs)
        started = True
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.verbose_progress = False
        if not log.isEnabledFor(logging.INFO):  # Ray Data's own start-up lines only with --verbose
            logging.getLogger("ray.data").setLevel(logging.ERROR)
        info = _pool(ray, settings, session_args["device"])
        log.info("ray: %s", info)
        rows = [{"item": _item_json(it)} for it in todo]
        blocks = max(1, min(math.ceil(len(rows) / opts.batch_size), 4096))
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        # A reading task reserves some memory for the decoded audio; its resources differing from the
        # actors' also keeps Ray Data from fusing the reading into the actors: CPU tasks decode while
        # the actors transcribe.
        ds = ds.map_batches(_ray_read, batch_size=opts.batch_size, batch_format="pyarrow", num_cpus=info["read_cpus"],
                            memory=_READ_TASK_MEMORY)
        options = {**dataclasses.asdict(opts), "hotwords": list(opts.hotwords)}
        remote: dict[str, Any] = {"num_cpus": info["actor_cpus"]}
        if info["gpus_per_actor"]:
            remote["num_gpus"] = info["gpus_per_actor"]
        ds = ds.map_batches(
            RayTranscriber, batch_size=opts.batch_size, batch_format="pyarrow",
            compute=ray.data.ActorPoolStrategy(size=info["actors"]),
            fn_constructor_kwargs={**session_args, "threads": info["threads_per_actor"], "options": options},
            **remote)
        for block in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            emit([json.loads(s) for s in block.column("record").to_pylist()])
            if stop is not None and stop.is_set():  # what is still in the pipeline is redone on resume
                break
        return info
    finally:
        if started:
            ray.shutdown()


def _pool(ray: Any, settings: RaySettings, device: str) -> dict[str, Any]:
    """The actor pool the cluster allows: actors, threads and CPUs (GPUs) per actor, CPUs per reading task."""
    total = ray.cluster_resources()
    cpus = float(total.get("CPU", 1.0))
    node_cpus = max([float(n["Resources"].get("CPU", 0.0)) for n in ray.nodes() if n.get("Alive")] or [cpus])
    gpu = device not in ("auto", "cpu")
    tpa = settings.threads_per_actor or max(1, min(4, int(node_cpus) - 1))
    gpus_per_actor = (settings.gpus_per_actor if settings.gpus_per_actor is not None else 1.0) if gpu else 0.0
    read_cpus = settings.read_cpus
    # Reserve at most what a node can give beside one reading task, or the pipeline would stall.
    actor_cpus = float(min(tpa, max(0.5, node_cpus - read_cpus)))
    actors = settings.actors
    if actors is None:
        if gpu:
            actors = max(1, int(float(total.get("GPU", 0.0)) // (gpus_per_actor or 1.0)))
        else:
            actors = max(1, int((cpus - read_cpus) // actor_cpus))
    return {"address": settings.address, "actors": actors, "threads_per_actor": tpa, "actor_cpus": actor_cpus,
            "gpus_per_actor": gpus_per_actor, "read_cpus": read_cpus, "cluster_cpus": cpus,
            "cluster_gpus": float(total.get("GPU", 0.0)), "nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}
