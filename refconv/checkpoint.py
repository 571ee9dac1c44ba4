"""Sharded checkpoints that reload onto any grid, algorithm or world size.

A checkpoint is a directory::

    shard-00000-of-00004-step-00000120-save-000007.npz   rank 0's local blocks, each 4-D:
    ...                                "param/<name>", "buffer/<name>" (e.g. BatchNorm running
                                       statistics) and "momentum/<name>" (the SGD buffer,
                                       sharded like its parameter)
    manifest.json              written last, by rank 0: the table below

===================  ================================================================
manifest field       meaning
===================  ================================================================
``format``           ``"refconv-checkpoint"``; ``version``: 2 (1, without ``save``, still loads)
``world_size``       ranks that saved (one shard file each)
``save``             the save number in the shard names: 1 + the largest in the directory
``step``, ``extra``  the caller's training position (``extra``: any JSON, from rank 0)
``shards``           per rank: ``file`` and the ``sha256`` of its bytes
``tensors``          per tensor: ``name``, ``kind`` (param | buffer | momentum), ``key`` in the
                     shards, 4-D ``global_shape``, original ``shape``, ``dtype``,
                     ``distribution`` (for people), and ``pieces[rank][dim]``: the
                     (start, stop) ranges of each dim that rank holds (``dist.pieces``)
===================  ================================================================

Save: every save gets a new save number, larger than any in the directory's file
names, so its shards go to names that no manifest vouches for, even at the step of
the committed checkpoint.  Every rank writes its shard to a temporary name, fsyncs
and ``os.replace``-s it; after all ranks agree that every shard is on disk, rank 0
replaces the manifest the same way: that is the commit point.  Only then are the
superseded shards, and the temporary files and uncommitted shards of killed saves,
removed.  A job killed at any moment (``FAULT_POINTS``, tested) leaves either the
previous checkpoint or the new one, never a mixture.  A directory without
``manifest.json`` is an incomplete checkpoint.

Load: every rank validates the manifest against the model, verifies checksums,
rebuilds each global tensor from the shards that cover it (shared filesystem) and
extracts its block under the model's CURRENT distribution: that is the resharding.
Ranks agree on success through ``refconv.collectives`` before anything is
assigned, so an error is raised on every rank with the same text and nothing is
partially loaded.
"""

import contextlib
import fcntl
import hashlib
import io
import json
import os
import re

import numpy

from refconv import checks, collectives, datasets
from refconv.arrays import array_module, to_host
from refconv.optim import named_parameters

__all__ = ["save", "load", "nonfinite", "lock", "CheckpointError", "shard_name", "MANIFEST", "FORMAT", "VERSION"]

FORMAT = "refconv-checkpoint"
VERSION = 2
MANIFEST = "manifest.json"

# Where a save may be interrupted, in order (REFCONV_FAULT=rank:<point>:kill tests each):
FAULT_POINTS = (
    "checkpoint.begin",            # arguments checked, save number agreed, nothing written
    "checkpoint.shard-temp",       # this rank's shard in its temporary file, fsynced
    "checkpoint.shard",            # ... renamed to its final name: not yet committed
    "checkpoint.manifest-temp",    # rank 0: every shard on disk, the new manifest in a temp file
    "checkpoint.commit",           # rank 0: manifest replaced: the new checkpoint is committed
    "checkpoint.cleanup",          # rank 0: the first superseded file removed
)
_SAVE_NUMBER = re.compile(r"^\.?shard-\d+-of-\d+-step-\d+-save-(\d+)\.npz")


class CheckpointError(ValueError):
    """A checkpoint that cannot be saved or loaded; raised on every rank alike."""


def shard_name(rank, size, step, save):
    """Shard files carry a save number no earlier save used, so a new save never
    overwrites the files that the current manifest vouches for (``save=None``: the
    names of version 1, which carried only the step)."""
    if save is None:
        return f"shard-{rank:05d}-of-{size:05d}-step-{step:08d}.npz"
    return f"shard-{rank:05d}-of-{size:05d}-step-{step:08d}-save-{save:06d}.npz"


class _Entry:
    """One tensor to save or load, on this rank: a parameter, its momentum buffer, or a
    layer buffer such as BatchNorm's running statistics."""

    def __init__(self, name, kind, layer, dist, local):
        self.name, self.kind, self.key = name, kind, f"{kind}/{name}"
        self.dist = dist
        self.rank = layer.grid.rank
        self.comm = layer.grid.comm
        self.local = local                        # the live shard, written in place on load

    def block4(self):
        """The local shard as its 4-D block of the global tensor (5-D: a 3-D convolution's weight), on the host."""
        return to_host(self.local).reshape(self.dist.local_shape(self.rank))


def _entries(model, optimizer):
    entries = [_Entry(q, "param", layer, layer.parameter_distributions()[p], layer.parameters()[p])
               for q, layer, p in named_parameters(model)]
    if not entries:
        raise CheckpointError("model has no parameters (named_parameters() is empty)")
    entries += [_Entry(q, "buffer", layer, layer.buffer_distributions()[b], layer.buffers()[b])
                for q, layer, b in model.named_buffers()]      # e.g. BatchNorm running statistics
    if optimizer is not None:
        buffers = optimizer.state()
        entries += [_Entry(q, "momentum", layer, layer.parameter_distributions()[p], buffers[q])
                    for q, layer, p in optimizer.entries if q in buffers]
    return entries


def nonfinite(model, optimizer=None):
    """This rank's first tensor with a NaN or an infinity, as ``"param/conv1.weight (12 of
    864 values)"``, or None when every parameter, buffer and momentum shard is finite.
    Local: no communication (``save`` agrees on it; ``refconv train`` checks with it)."""
    for e in _entries(model, optimizer):
        xp = array_module(e.local)
        bad = int(e.local.size - xp.count_nonzero(xp.isfinite(e.local)))
        if bad:
            return f"{e.key} ({bad} of {e.local.size} values on rank {e.rank})"
    return None


def lock(directory):
    """Hold an exclusive lock on ``directory`` (created if missing) for as long as the returned
    file descriptor stays open: a second run that writes the same checkpoints is refused at its
    start instead of racing this one.  One process takes it (``refconv train``: rank 0).
    ``flock`` on the folder itself, so no lock file is left behind; it is local to a node
    unless the shared filesystem forwards flock (Lustre with ``-o flock``, NFSv4)."""
    directory = os.fspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY)
    except OSError as exc:
        raise CheckpointError(f"cannot create {directory!r}: {exc.strerror}; give a folder you may write") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise CheckpointError(f"{directory!r} is in use by another run (it holds the folder's lock); give "
                              f"another checkpoint folder, or wait for that run to end") from None
    return fd


# -- save ------------------------------------------------------------------------------------
def save(directory, model, optimizer=None, *, step, extra=None):
    """Write a checkpoint of ``model`` (and ``optimizer``'s momentum) to ``directory``.

    Collective over the model's communicator.  ``step``: an int; ``extra``: any
    JSON-serialisable value (numpy scalars and arrays are converted), rank 0's is kept.
    An existing checkpoint in ``directory`` is replaced once the new one is committed.
    A tensor with a NaN or an infinity on any rank is refused (CheckpointError on every
    rank) before anything is written: a diverged run never replaces a good checkpoint.
    """
    entries = _entries(model, optimizer)
    comm = entries[0].comm
    rank, size = comm.Get_rank(), comm.Get_size()
    directory = os.fspath(directory)

    error = save_number = None
    try:
        step = _check_step(step)
        extra = json.loads(json.dumps(extra, default=_json_default))
        bad = nonfinite(model, optimizer)
        if bad is not None:
            raise ValueError(f"{bad} are not finite (NaN or inf); the checkpoint already there is kept")
        os.makedirs(directory, exist_ok=True)
        if rank == 0:
            save_number = 1 + max(_save_numbers(directory), default=0)
    except (TypeError, ValueError, OSError) as exc:
        error = f"cannot save to {directory!r}: {exc}"
    _agree(comm, error, "checkpoint.save")
    save_number = collectives.bcast_object(comm, save_number)
    collectives.fault_point("checkpoint.begin")
    mine = shard_name(rank, size, step, save_number)

    try:
        buf = io.BytesIO()
        numpy.savez(buf, **{e.key: e.block4() for e in entries})
        blob = buf.getvalue()
        _write_atomic(os.path.join(directory, mine), blob, "checkpoint.shard-temp")
        _fsync_directory(directory)
        digest = numpy.frombuffer(hashlib.sha256(blob).digest(), dtype=numpy.uint8).copy()
    except Exception as exc:                      # any failure must reach every rank
        error = f"cannot write {mine}: {type(exc).__name__}: {exc}"
    collectives.fault_point("checkpoint.shard")
    _agree(comm, error, "checkpoint.save")        # every shard is on disk past this point
    digests = collectives.gather(comm, digest, [(32,)] * size)

    if rank == 0:
        manifest = {
            "format": FORMAT, "version": VERSION, "world_size": size, "step": step,
            "save": save_number, "extra": extra,
            "shards": [{"file": shard_name(r, size, step, save_number), "sha256": bytes(d).hex()}
                       for r, d in enumerate(digests)],
            "tensors": [_describe(e, size) for e in entries],
        }
        try:
            _write_atomic(os.path.join(directory, MANIFEST), _dumps(manifest).encode(),
                          "checkpoint.manifest-temp")
            _fsync_directory(directory)           # the commit point
            collectives.fault_point("checkpoint.commit")
            _remove_superseded(directory, {s["file"] for s in manifest["shards"]})
        except OSError as exc:
            error = f"cannot write {MANIFEST}: {exc}"
    _agree(comm, error, "checkpoint.save")


def _save_numbers(directory):
    """The save numbers in the names of the shards (and their temporary files) in directory."""
    return [int(m.group(1)) for m in map(_SAVE_NUMBER.match, os.listdir(directory)) if m]


def _remove_superseded(directory, keep):
    """After the commit: every shard the new manifest does not name (the previous save's,
    and those of killed saves) and every temporary file a killed save left behind."""
    for name in sorted(os.listdir(directory)):
        shard = name.startswith("shard-") and name.endswith(".npz") and name not in keep
        temporary = name.startswith((".shard-", f".{MANIFEST}")) and ".tmp-" in name
        if shard or temporary:
            os.remove(os.path.join(directory, name))
            collectives.fault_point("checkpoint.cleanup")


def _describe(e, size):
    g = e.dist.global_shape
    ndim = e.local.ndim
    original = g[:ndim] if int(numpy.prod(g[:ndim])) == int(numpy.prod(g)) else g
    return {"name": e.name, "kind": e.kind, "key": e.key, "global_shape": list(g),
            "shape": list(original), "dtype": numpy.dtype(e.local.dtype).str,
            "distribution": repr(e.dist),
            "pieces": [[[list(p) for p in e.dist.pieces(r, d)] for d in range(len(g))]
                       for r in range(size)]}


def _dumps(manifest):
    """JSON with one line per top-level field and per shard / tensor entry."""
    def field(k, v):
        if isinstance(v, list) and v:
            return f" {json.dumps(k)}: [\n  " + ",\n  ".join(json.dumps(x) for x in v) + "\n ]"
        return f" {json.dumps(k)}: {json.dumps(v)}"
    return "{\n" + ",\n".join(field(k, v) for k, v in manifest.items()) + "\n}\n"


def _write_atomic(path, data, fault_point):
    """Temp file in the same directory, fsync, then os.replace: all or nothing.
    ``fault_point`` names the moment between the two for REFCONV_FAULT."""
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)                        # a full disk leaves no partial file to trip the next save
        raise
    collectives.fault_point(fault_point)
    os.replace(tmp, path)


def _fsync_directory(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return                                    # not supported here (e.g. Windows)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _json_default(v):
    if isinstance(v, numpy.generic):
        return v.item()
    if isinstance(v, numpy.ndarray):
        return v.tolist()
    raise TypeError(f"extra: {type(v).__name__} is not JSON-serialisable")


def _check_step(step):
    return checks.integer(step, "step", minimum=0)


# -- load ------------------------------------------------------------------------------------
def load(directory, model, optimizer=None):
    """Load ``directory`` into ``model`` (and ``optimizer``); returns ``(step, extra)``.

    Collective.  The checkpoint may come from any grid, algorithm or world size;
    each rank takes its block under the model's current distributions (values are
    cast to the current dtype).  Raises CheckpointError on every rank, before
    changing anything, if the checkpoint is incomplete, corrupt, or does not fit.
    """
    entries = _entries(model, optimizer)
    comm = entries[0].comm
    directory = os.fspath(directory)
    error = manifest = blocks = None
    try:
        manifest = _read_manifest(directory)
        blocks = _read_blocks(directory, manifest, entries, comm.Get_rank(), comm.Get_size())
    except CheckpointError as exc:
        error = str(exc)
    except Exception as exc:                      # anything else must not strand the others
        error = f"{type(exc).__name__}: {exc}"
    _agree(comm, error, f"checkpoint.load({directory!r})")

    for e in entries:                             # all ranks validated: now assign
        e.local[...] = array_module(e.local).asarray(blocks[e.key], dtype=e.local.dtype)
    return manifest["step"], manifest["extra"]


def _read_manifest(directory):
    path = os.path.join(directory, MANIFEST)
    if not os.path.isdir(directory):
        raise CheckpointError(f"{directory!r} is not a directory")
    if not os.path.exists(path):
        raise CheckpointError(f"incomplete checkpoint: {directory!r} has no {MANIFEST} "
                              f"(the save did not finish, or this is not a checkpoint)")
    if not os.path.isfile(path):
        raise CheckpointError(f"{MANIFEST} in {directory!r} is not a regular file (a FIFO would block every rank)")
    try:
        with open(path, "rb") as f:
            manifest = json.loads(f.read().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{MANIFEST} is not valid JSON ({exc})") from None
    try:
        _check_manifest(manifest)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{MANIFEST} is malformed: {exc}") from None
    return manifest


def _check_manifest(m):
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"format must be {FORMAT!r}")
    if m["version"] not in (1, VERSION):
        raise ValueError(f"version {m['version']!r}; this refconv reads versions 1 and {VERSION}")
    size = m["world_size"]
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {size!r}")
    _check_step(m["step"])
    m["extra"]
    save = m["save"] if m["version"] >= 2 else None
    if save is not None and (isinstance(save, bool) or not isinstance(save, int) or save < 1):
        raise ValueError(f"save must be an int >= 1, got {save!r}")
    if len(m["shards"]) != size:
        raise ValueError(f"{len(m['shards'])} shards listed for world_size {size}")
    for r, s in enumerate(m["shards"]):
        name = shard_name(r, size, m["step"], save)
        if s["file"] != name or not isinstance(s["sha256"], str):
            raise ValueError(f"shards[{r}] must be {{'file': {name!r}, 'sha256': hex}}, got {s!r}")
    for t in m["tensors"]:
        g = t["global_shape"]
        if len(g) not in (4, 5) or not all(isinstance(n, int) and n >= 1 for n in g):
            raise ValueError(f"{t['name']}: global_shape must be 4 ints >= 1 (5 for a 3-D convolution's weight), "
                             f"got {g!r}")
        numpy.dtype(t["dtype"])
        if t["kind"] not in ("param", "buffer", "momentum") or t["key"] != f"{t['kind']}/{t['name']}":
            raise ValueError(f"{t['name']}: bad kind/key {t['kind']!r}/{t['key']!r}")
        if len(t["pieces"]) != size:
            raise ValueError(f"{t['name']}: pieces has {len(t['pieces'])} ranks, not {size}")
        for rank_pieces in t["pieces"]:
            for d, pieces in enumerate(rank_pieces):
                if not pieces or not all(0 <= s < e <= g[d] for s, e in pieces):
                    raise ValueError(f"{t['name']}: pieces {pieces} outside dim {d} of {g}")


def _index(rank_pieces):
    """numpy.ix_ index of a rank's block from its per-dim (start, stop) pieces."""
    return numpy.ix_(*[numpy.concatenate([numpy.arange(s, e) for s, e in p])
                       for p in rank_pieces])


def _covering_ranks(t):
    """Ranks whose blocks together cover tensor ``t`` (greedy in rank order)."""
    covered = numpy.zeros(t["global_shape"], dtype=bool)
    ranks = []
    for r, rank_pieces in enumerate(t["pieces"]):
        ix = _index(rank_pieces)
        if not covered[ix].all():
            covered[ix] = True
            ranks.append(r)
    if not covered.all():
        raise CheckpointError(f"{MANIFEST}: the shards do not cover all of {t['key']}")
    return ranks


def _read_blocks(directory, m, entries, rank, size):
    """{key: this rank's new local block}, after every check; nothing is assigned here."""
    tensors = {t["key"]: t for t in m["tensors"]}
    for e in entries:
        t = tensors.get(e.key)
        if t is None:
            hint = " (saved without an optimizer?)" if e.kind == "momentum" else ""
            raise CheckpointError(f"checkpoint has no tensor {e.key}{hint}")
        if tuple(t["global_shape"]) != e.dist.global_shape:
            raise CheckpointError(f"{e.key}: checkpoint global shape {tuple(t['global_shape'])} "
                                  f"!= the model's {e.dist.global_shape}")
    wanted = {e.key for e in entries}
    unknown = sorted(k for k, t in tensors.items() if t["kind"] in ("param", "buffer") and k not in wanted)
    if unknown:
        raise CheckpointError(f"checkpoint has parameters the model lacks: {unknown}")

    plan = {e.key: _covering_ranks(tensors[e.key]) for e in entries}
    needed = sorted({r for ranks in plan.values() for r in ranks})
    mine = set(range(rank, m["world_size"], size))   # this rank verifies every size-th shard too
    shards = {}
    for r in sorted(set(needed) | mine):
        name = m["shards"][r]["file"]
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            raise CheckpointError(f"missing shard {name} (rank {r} of {m['world_size']})")
        if not os.path.isfile(path):
            raise CheckpointError(f"shard {name} is not a regular file (a FIFO would block every rank)")
        with open(path, "rb") as f:
            blob = f.read()
        if hashlib.sha256(blob).hexdigest() != m["shards"][r]["sha256"]:
            raise CheckpointError(f"corrupt shard {name}: its SHA-256 does not match {MANIFEST}")
        if r in needed:
            shards[r] = numpy.load(io.BytesIO(blob), allow_pickle=False)

    blocks = {}
    for e in entries:
        t = tensors[e.key]
        global_ = numpy.empty(t["global_shape"], dtype=numpy.dtype(t["dtype"]))
        for r in plan[e.key]:
            ix = _index(t["pieces"][r])
            if e.key not in shards[r].files:
                raise CheckpointError(f"{m['shards'][r]['file']} lacks {e.key}")
            block = datasets.archive_member(shards[r], e.key)
            if block.shape != global_[ix].shape:
                raise CheckpointError(f"{m['shards'][r]['file']}: {e.key} has shape "
                                      f"{block.shape}, {MANIFEST} says {global_[ix].shape}")
            global_[ix] = block
        blocks[e.key] = e.dist.extract(global_, e.rank).reshape(e.local.shape)
    return blocks


# -- agreement -------------------------------------------------------------------------------
def _agree(comm, error, what):
    """Collective: raise CheckpointError on every rank, with the same text, if any rank
    has an ``error`` (a string; None when fine).  Two allgathers of bytes."""
    size = comm.Get_size()
    text = (error or "").encode()
    lengths = collectives.allgather(comm, numpy.array([len(text)], dtype=numpy.int64), [1] * size)
    if not lengths.any():
        return
    everything = collectives.allgather(comm, numpy.frombuffer(text, dtype=numpy.uint8).copy(),
                                       [int(n) for n in lengths])
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths)])
    by_message = {}
    for r in range(size):
        if lengths[r]:
            msg = bytes(everything[offsets[r]:offsets[r + 1]]).decode()
            by_message.setdefault(msg, []).append(r)
    lines = [f"{what} failed"]
    for msg, ranks in by_message.items():
        where = "every rank" if len(ranks) == size else f"rank(s) {ranks} of {size}"
        lines.append(f"  on {where}: {msg}")
    raise CheckpointError("\n".join(lines))
