"""Sharded checkpoints: every rank writes its shard of the fp32 weights and Adam states with
safetensors, rank 0 writes an index; loads into any data-parallel size; consolidates offline.

[Note: sharded checkpoint layout] A directory holds ``gemini-rank<R>-of-<W>.safetensors`` per
rank, with 1-D tensors ``param/<name>``, ``exp_avg/<name>``, ``exp_avg_sq/<name>`` and
``step/<name>`` for the elements of each parameter that rank's shard holds, and
``gemini_index.json``: per parameter its shape and the ``[rank, start, end]`` element ranges of
its flattened value in each file, the aliases of tied parameters, the loss scaler, and ``files``:
the SHA-256 and size of every shard file and the buffers file, checked when a file is first read
(a shard swapped in from another run of the same shape is named, not loaded). Buffers are in
``gemini-buffers.safetensors``. Values are fp32 (the masters), whatever the precision.

[Note: omitted frozen values] Saved with ``frozen_values=False`` (a LoRA run's checkpoints),
frozen parameters are neither written nor listed in ``params``; the index names them under
``frozen_omitted``. A load then keeps the values the model's frozen parameters have (rebuilt
from their source by the caller, which checks them: the job against the base fingerprint), and
refuses a name omitted there that trains in the model.

[Note: whole or not at all] Before any value reaches the model, loading proves the checkpoint
whole: each parameter's ranges cover every element of its flattened shape exactly once (sorted,
no gap, no overlap, ranks within ``world_size``), and every file named by a range holds
``param/<name>`` (and, with optimizer state, ``exp_avg``/``exp_avg_sq``) of exactly that range's
length, and some file holds ``step/<name>``. An index edited so that a tensor is half covered,
with its hashes recomputed, is refused naming the file and the parameter.

Saving and loading go chunk by chunk: a rank's file is streamed from its shards (its header is
computed from the chunk records first, [Note: streamed safetensors]) and hashed while written;
loading ``pread``s each parameter's element ranges from the files straight into its shard
(``SafetensorsRangeReader``: no file is mapped). No step holds more than one tensor beyond the
chunks themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from torch import nn

from colossal_contracts import CheckpointError

from .._safetensors_stream import SafetensorsRangeReader, SafetensorsStream, TensorSpec
from ..optim._scaler import DynamicLossScaler
from ._module import GeminiModule
from ._optimizer import STATE_KINDS, GeminiOptimizer

__all__ = [
    "INDEX_FILE",
    "consolidate",
    "file_digest",
    "load_sharded",
    "omitted_frozen",
    "save_sharded",
]

INDEX_FILE = "gemini_index.json"
BUFFERS_FILE = "gemini-buffers.safetensors"
FORMAT = 1


def file_digest(path: Path) -> dict[str, Any]:
    """``{"sha256": hex, "bytes": size}`` of a file, read into one reused 1 MiB buffer."""
    h = hashlib.sha256()
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _gather_digests(model: GeminiModule, name: str, digest: dict[str, Any]) -> dict[str, Any]:
    """Every rank's ``{file name: digest}`` on every rank of the model's group. Collective."""
    g = model.runtime.group
    if g is None:
        return {name: digest}
    out: list[Any] = [None] * dist.get_world_size(g)
    dist.all_gather_object(out, (name, digest), group=g)
    return dict(out)


def _shard_file(rank: int, world: int) -> str:
    return f"gemini-rank{rank:05d}-of-{world:05d}.safetensors"


def _rank_world(model: GeminiModule) -> tuple[int, int]:
    g = model.runtime.group
    return (dist.get_rank(g), dist.get_world_size(g)) if g is not None else (0, 1)


def _fp32_chunk(model: GeminiModule, c: Any) -> Any:
    rt = model.runtime
    return rt.roles.fp32(c)


_Item = tuple[TensorSpec, Callable[[], torch.Tensor]]  # what to write, how to read it then


def _plan_shard(
    model: GeminiModule, optimizer: GeminiOptimizer | None, world: int, frozen_values: bool = True
) -> tuple[dict[str, Any], list[tuple[list[Any], list[_Item]]]]:
    """The index's ``params`` entries and, per parameter chunk, the chunks its values live in
    and the tensors this rank writes from them (specs from the records: no value is read);
    frozen chunks left out unless ``frozen_values`` ([Note: omitted frozen values])."""
    m = model.runtime.manager
    params: dict[str, Any] = {}
    groups: list[tuple[list[Any], list[_Item]]] = []
    for c in m.param_chunks():
        if c.frozen and not frozen_values:
            continue
        fp32 = _fp32_chunk(model, c)
        with_states = optimizer is not None and not c.frozen  # frozen: values only
        states = [m.parallel_chunk(k, c) for k in STATE_KINDS] if with_states else []
        items: list[_Item] = []
        for name, rec in c.records.items():
            ranges = []
            for r in range(world):
                lo = r * c.shard_numel
                a, b = max(lo, rec.offset), min(lo + c.shard_numel, rec.end)
                if a < b:
                    ranges.append([r, a - rec.offset, b - rec.offset])
            params[name] = {"shape": list(rec.shape), "ranges": ranges}
            part = fp32.shard_view(name)
            if part is None:
                continue
            numel = part[2] - part[1]
            for kind, chunk in [("param", fp32), *zip(STATE_KINDS, states)]:
                spec = TensorSpec(f"{kind}/{name}", torch.float32, (numel,))
                items.append((spec, lambda ch=chunk, n=name: ch.shard_view(n)[0].float()))
            if optimizer is not None and name in optimizer.steps:
                spec = TensorSpec(f"step/{name}", torch.float32, (1,))
                items.append((spec, lambda n=name: optimizer.steps[n].reshape(1).float()))
        groups.append(([fp32, *states], items))
    return params, groups


@torch.no_grad()
def save_sharded(
    model: GeminiModule,
    optimizer: GeminiOptimizer | None,
    directory: Path,
    *,
    frozen_values: bool = True,
) -> None:
    """Write this rank's shard (and, on rank 0, the index and buffers) into ``directory``, which
    must exist. Every rank of the model's group calls it; see [Note: sharded checkpoint layout].
    ``frozen_values=False`` leaves frozen parameters out ([Note: omitted frozen values]).

    Streams ([Note: streamed safetensors]): the file's header comes from the chunk records, then
    the values are written chunk by chunk straight from their shards; a chunk on the disk tier is
    read ahead while the one before it is written and its pages are let go after, one on the
    accelerator is copied to the host one tensor at a time. Host memory beyond the chunks
    themselves: one tensor (none on the host tier)."""
    rt, m = model.runtime, model.runtime.manager
    rank, world = _rank_world(model)
    params, groups = _plan_shard(model, optimizer, world, frozen_values)
    shard = directory / _shard_file(rank, world)
    specs = [spec for _, items in groups for spec, _ in items]
    with SafetensorsStream(shard, specs) as out:
        for i, (chunks, items) in enumerate(groups):
            if i + 1 < len(groups):
                m.read_ahead(groups[i + 1][0])
            for _, value in items:
                out.write(value())
            m.read_done(chunks)  # disk pages read here leave this process's memory
    files = _gather_digests(model, shard.name, out.close())
    if rank == 0:
        buffers = [(n, b.detach()) for n, b in model.module.named_buffers()]
        path = directory / BUFFERS_FILE
        with SafetensorsStream(path, [TensorSpec.of(n, b) for n, b in buffers]) as bf:
            for _, b in buffers:
                bf.write(b)
        files[BUFFERS_FILE] = bf.close()
        index = {
            "format": FORMAT,
            "world_size": world,
            "precision": rt.precision.name,
            "params": params,
            "aliases": rt.aliases,
            "optimizer": optimizer is not None,
            "scaler": optimizer.scaler.state_dict() if optimizer and optimizer.scaler else None,
            "files": files,
        }
        if not frozen_values:
            index["frozen_omitted"] = sorted(
                n for c in m.param_chunks() if c.frozen for n in c.records
            )
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=1))


class _Reader:
    """Reads element ranges of saved tensors from the shard files of a checkpoint."""

    def __init__(self, directory: Path):
        self.directory = directory
        try:
            self.index = json.loads((directory / INDEX_FILE).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise CheckpointError(
                f"{directory} has no readable {INDEX_FILE}: {err}; is it a Gemini checkpoint?"
            ) from err
        _validate_index(self.index, directory / INDEX_FILE)
        self._files: dict[int, SafetensorsRangeReader] = {}
        self._keys: dict[int, set[str]] = {}

    def check_shape(self, name: str, shape: list[int]) -> None:
        """``CheckpointError`` unless the checkpoint saved parameter ``name`` with ``shape``."""
        saved = self.index["params"].get(name)
        if saved is None or shape != saved["shape"]:
            raise CheckpointError(
                f"parameter {name!r} of shape {shape} does not match the checkpoint "
                f"{self.directory} ({saved['shape'] if saved else 'absent'}); same model and preset?"
            )

    def verify(self, name: str) -> Path:
        """The path of the checkpoint file ``name``, after checking it against the index's
        digest (indexes without ``files``, from before checksums, are not checked)."""
        path = self.directory / name
        want = self.index.get("files", {}).get(name)
        if want is not None:
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing")
            if file_digest(path) != want:
                raise CheckpointError(
                    f"checkpoint file {path} does not match the checksum in {INDEX_FILE}: it "
                    "was changed or copied from another checkpoint; restore the original file"
                )
        return path

    def check_whole(self, names: Any, *, optimizer: bool) -> None:
        """Prove the saved values of the parameters ``names`` complete before anything is read
        into a model (see [Note: whole or not at all]); ``CheckpointError`` naming the file."""
        kinds = ("param", *STATE_KINDS) if optimizer else ("param",)
        index_path = self.directory / INDEX_FILE
        for name in names:
            meta = self.index["params"][name]
            has_step = False
            for rank, a, b in meta["ranges"]:
                f = self._file(rank)
                for kind in kinds:
                    got = f.numel(f"{kind}/{name}")
                    if got != b - a:
                        held = "absent" if got is None else f"{got} elements"
                        raise CheckpointError(
                            f"{f.path}: '{kind}/{name}' is {held}, and {index_path} gives it "
                            f"range [{a}, {b}) ({b - a} elements); the checkpoint is incomplete: "
                            "resume from another checkpoint"
                        )
                has_step = has_step or f.numel(f"step/{name}") == 1
            if optimizer and not has_step and meta["ranges"]:
                raise CheckpointError(
                    f"{self.directory}: no shard file holds 'step/{name}' (Adam's step count) "
                    f"though {index_path} says 'optimizer' is true; resume from another checkpoint"
                )

    def _file(self, rank: int) -> SafetensorsRangeReader:
        if rank not in self._files:
            path = self.verify(_shard_file(rank, self.index["world_size"]))
            self._files[rank] = SafetensorsRangeReader(path)
            self._keys[rank] = self._files[rank].keys()
        return self._files[rank]

    def read_into(self, kind: str, name: str, start: int, out: torch.Tensor) -> bool:
        """Elements ``[start, start + out.numel())`` of the flattened ``kind/name`` into ``out``
        (read from each rank's file that holds some); False if it was not saved."""
        meta = self.index["params"].get(name)
        if meta is None:
            raise CheckpointError(
                f"{self.directory} has no parameter {name!r}; was it saved from another model?"
            )
        end = start + out.numel()
        for rank, a, b in meta["ranges"]:
            lo, hi = max(a, start), min(b, end)
            if lo >= hi:
                continue
            f = self._file(rank)
            key = f"{kind}/{name}"
            if key not in self._keys[rank]:
                return False
            f.read_into(key, lo - a, out[lo - start : hi - start])
        return True

    def read(self, kind: str, name: str, start: int, end: int) -> torch.Tensor | None:
        """Elements ``[start, end)`` of the flattened ``kind/name``; None if it was not saved."""
        out = torch.empty(end - start, dtype=torch.float32)
        return out if self.read_into(kind, name, start, out) else None

    def step(self, name: str) -> float | None:
        for rank, _, _ in self.index["params"][name]["ranges"]:
            f = self._file(rank)
            if f"step/{name}" in self._keys[rank]:
                return float(f.get(f"step/{name}")[0])
        return None

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def restore_scaler(self, scaler: DynamicLossScaler | None) -> None:
        """Load the saved loss scaler's state into ``scaler`` (when both exist)."""
        if scaler is not None and self.index.get("scaler"):
            scaler.load_state_dict(self.index["scaler"])

    def load_buffers(self, module: nn.Module) -> None:
        """Copy the saved buffers into ``module``'s buffers of the same names (the buffers
        file checked against the index first); buffers not saved keep their values."""
        path = self.directory / BUFFERS_FILE
        if not path.exists():
            return
        self.verify(BUFFERS_FILE)
        with safe_open(str(path), framework="pt") as f:
            own = dict(module.named_buffers())
            for n in list(f.keys()):
                if n in own:
                    own[n].copy_(f.get_tensor(n))


def omitted_frozen(index: dict[str, Any], frozen: set[str], directory: Path) -> set[str]:
    """The parameters a sharded checkpoint saved without values ([Note: omitted frozen
    values]); ``CheckpointError`` when one of them trains in the model being loaded."""
    omitted = set(index.get("frozen_omitted", []))
    trains = sorted(omitted - frozen)
    if trains:
        raise CheckpointError(
            f"{directory / INDEX_FILE} saved {trains[0]!r} (and {len(trains) - 1} more) without "
            "values as frozen, and it trains in this model; resume with the run's LoRA settings "
            "(--lora-rank ...) or from a checkpoint that holds every weight"
        )
    return omitted


@torch.no_grad()
def load_sharded(model: GeminiModule, optimizer: GeminiOptimizer | None, directory: Path) -> None:
    """Restore what ``save_sharded`` wrote, from any data-parallel size, into this rank's shards.
    ``CheckpointError`` when files are missing or do not match the model."""
    reader = _Reader(directory)
    rt, m = model.runtime, model.runtime.manager
    index = reader.index
    mine = []
    frozen = {n for n, p in model.module.named_parameters() if not p.requires_grad}
    omitted = omitted_frozen(index, frozen, directory)  # [Note: omitted frozen values]
    for c in m.param_chunks():  # shapes first, then [Note: whole or not at all]: nothing read yet
        for name, rec in c.records.items():
            if name in omitted:
                continue
            reader.check_shape(name, list(rec.shape))
            mine.append(name)
    with_state = optimizer is not None and index["optimizer"]
    reader.check_whole([n for n in mine if n not in frozen], optimizer=with_state)
    reader.check_whole([n for n in mine if n in frozen], optimizer=False)
    for c in m.param_chunks():
        if c.frozen and omitted.issuperset(c.records):
            continue  # its values stay the model's
        fp32 = _fp32_chunk(model, c)
        states = (
            [] if c.frozen or optimizer is None else [m.parallel_chunk(k, c) for k in STATE_KINDS]
        )
        if c.frozen:  # loaded into its shard: a gathered copy would go stale
            rt.restore_params(c)
        for name in c.records:
            if optimizer is not None and index["optimizer"]:
                # every rank counts every tensor's steps (chunks may be re-packed later)
                step = reader.step(name)
                if step is not None:
                    optimizer.steps[name] = torch.tensor(step, dtype=torch.float32)
            part = fp32.shard_view(name)
            if part is None:
                continue
            view, a, _ = part
            reader.read_into("param", name, a, view)  # straight into the shard
            if not states or not index["optimizer"]:
                continue
            for kind, chunk in zip(STATE_KINDS, states, strict=True):
                reader.read_into(kind, name, a, chunk.shard_view(name)[0])  # type: ignore[index]
        if rt.precision.master and not c.frozen:
            rt.restore_params(c)
        # chunk by chunk: what was written into chunks on disk is written out of memory
        m.written(dict.fromkeys([c, fp32, *states]))
    rt.clear_grads()
    reader.restore_scaler(optimizer.scaler if optimizer is not None else None)
    reader.close()
    reader.load_buffers(model.module)


def consolidate(directory: Path) -> dict[str, torch.Tensor]:
    """The full fp32 state dict (every name, tied ones included, and buffers) of a sharded
    checkpoint, loadable by ``module.load_state_dict``; frozen parameters saved without their
    values ([Note: omitted frozen values]) are absent. Needs no process group."""
    reader = _Reader(directory)
    full: dict[str, torch.Tensor] = {}
    for name, meta in reader.index["params"].items():
        numel = 1
        for d in meta["shape"]:
            numel *= d
        value = reader.read("param", name, 0, numel)
        full[name] = value.view(meta["shape"])  # type: ignore[union-attr]
    reader.close()
    out = {a: full[c].clone() for a, c in reader.index["aliases"].items() if c in full}
    buffers = directory / BUFFERS_FILE
    if buffers.exists():
        reader.verify(BUFFERS_FILE)
        with safe_open(str(buffers), framework="pt") as f:
            out.update({n: f.get_tensor(n) for n in list(f.keys())})
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _coverage_fault(meta: dict[str, Any], world: int) -> str | None:
    """What is wrong with ``meta``'s ranges as a cover of its flattened shape, exactly once."""
    numel = 1
    for d in meta["shape"]:
        numel *= d
    at = 0
    for rank, a, b in sorted(meta["ranges"], key=lambda r: r[1]):
        if not 0 <= rank < world:
            return f"name rank {rank}, outside world_size {world}"
        if a != at or b <= a:
            what = "overlap" if a < at else "leave a gap" if a > at else "hold an empty range"
            return f"{what} at element {min(a, at)} of {numel}"
        at = b
    if at != numel:
        return f"cover {at} of its {numel} elements"
    return None


def _validate_index(index: Any, path: Path) -> None:
    """``CheckpointError`` naming the first key of ``path`` that is missing or of the wrong type."""

    def bad(what: str) -> CheckpointError:
        return CheckpointError(
            f"{path} is malformed: {what}; the index was edited or damaged (or is another "
            "tool's file): restore it or resume from another checkpoint"
        )

    if not isinstance(index, dict):
        raise bad("expected a JSON object")
    if index.get("format") != FORMAT:
        raise bad(f"unknown format {index.get('format')!r} (this version reads format {FORMAT})")
    if not _is_int(index.get("world_size")) or index["world_size"] < 1:
        raise bad("'world_size' must be a positive int")
    params = index.get("params")
    if not isinstance(params, dict):
        raise bad("'params' must be an object of parameter entries")
    for name, meta in params.items():
        ok = (
            isinstance(meta, dict)
            and isinstance(meta.get("shape"), list)
            and all(_is_int(d) and d >= 0 for d in meta["shape"])
            and isinstance(meta.get("ranges"), list)
            and all(
                isinstance(r, list) and len(r) == 3 and all(_is_int(v) for v in r)
                for r in meta["ranges"]
            )
        )
        if not ok:
            raise bad(f"entry {name!r} needs 'shape' (list of ints) and 'ranges' ([rank, a, b]s)")
        gap = _coverage_fault(meta, index["world_size"])
        if gap:
            raise bad(f"the 'ranges' of {name!r} {gap}")
    if not isinstance(index.get("aliases"), dict) or not all(
        isinstance(v, str) for v in index["aliases"].values()
    ):
        raise bad("'aliases' must map parameter names to names")
    if not isinstance(index.get("optimizer"), bool):
        raise bad("'optimizer' must be true or false")
    scaler = index.get("scaler")
    if scaler is not None and not (
        isinstance(scaler, dict)
        and all(isinstance(scaler.get(k), (int, float)) for k in ("scale", "num_skipped", "clean"))
    ):
        raise bad("'scaler' must be null or an object with numeric scale, num_skipped, clean")
    files = index.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and _is_int(v.get("bytes"))
        for v in files.values()
    ):
        raise bad("'files' must map file names to {sha256, bytes}")
