"""An in-process sampler that tells where a server's resident memory goes: Python objects, glibc's heap in use,
glibc's free-but-resident blocks, or something else (native libraries' own maps, thread stacks).

RSS alone cannot say whether a slow creep is a Python list that never forgets, a native library's cache, or
freed memory glibc keeps (fragmentation, per-thread arenas). This thread samples, every few seconds, what each
layer holds, so a driver (benchmarks/rss_attribution.py) can fit a slope to each and see which one grows like RSS:

- /proc/self/smaps_rollup (Rss, Anonymous, Private_Dirty) and the thread count;
- glibc's mallinfo2 summed over all arenas: bytes in use (uordblks + hblkhd) and free inside the heaps (fordblks),
  and malloc_info's count of arenas;
- Python: sys.getallocatedblocks() and, with tracemalloc on, its traced bytes; every snapshot period a tracemalloc
  diff against the first snapshot after the warm-up and against the previous one (top lines and tracebacks), and
  gc's objects counted by type.

tracemalloc starts only once the server answers /readyz (PORT from the environment), and the warm-up counts from
then: imports and model loading are not traced (they would make start-up several times slower and every snapshot
huge), so a snapshot holds only what serving allocated and still keeps.

It starts only when the environment asks (RSS_PROBE_DIR) and only in the server (argv[0] ends with app.py), from
a sitecustomize.py that the driver writes; nothing here runs at import time.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

SIZE_T_FIELDS = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


SNAPSHOT_REQUEST = "snapshot.request"  # a file a driver creates in DIR: one snapshot at the next sample, then deleted


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in SIZE_T_FIELDS]


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def mallinfo() -> dict:
    """glibc's counters, summed over every arena; {} where the C library has no mallinfo2."""
    libc = _libc()
    function = getattr(libc, "mallinfo2", None)
    if function is None:
        return {}
    function.restype = _Mallinfo2
    info = function()
    return {name: int(getattr(info, name)) for name in SIZE_T_FIELDS}


def arena_count() -> int | None:
    """How many malloc arenas exist (the main one and one per thread that needed its own, up to 8 per core)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_info"):
        return None
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as file:
        handle = libc.fopen(file.name.encode(), b"w")
        if not handle:
            return None
        libc.malloc_info(0, handle)
        libc.fclose(handle)
        return Path(file.name).read_text().count("<heap nr=")


def smaps_rollup() -> dict:
    wanted = {"Rss", "Anonymous", "Private_Dirty", "Private_Clean", "Shared_Clean"}
    out = {}
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in wanted:
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def sample() -> dict:
    import tracemalloc

    info = mallinfo()
    row = {
        "t": time.time(),
        **{f"smaps_{k}": v for k, v in smaps_rollup().items()},
        "threads": len(os.listdir("/proc/self/task")),
        "py_threads": threading.active_count(),
        "py_blocks": sys.getallocatedblocks(),
        "traced": tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else None,
        "malloc_in_use": info.get("uordblks", 0) + info.get("hblkhd", 0) if info else None,
        "malloc_mmapped": info.get("hblkhd"),
        "malloc_heap": info.get("arena"),
        "malloc_free_in_heap": info.get("fordblks"),
        "arenas": arena_count(),
        "gc_collections": [generation["collections"] for generation in gc.get_stats()],
        "gc_pending": list(gc.get_count()),
    }
    return row


def type_counts() -> collections.Counter:
    """gc-tracked objects by type (some types' __module__ is not a string: a descriptor of their metaclass)."""
    counts: collections.Counter = collections.Counter(type(o) for o in gc.get_objects())
    named: collections.Counter = collections.Counter()
    for kind, count in counts.items():
        named[f"{getattr(kind, '__module__', '?')!s}.{getattr(kind, '__qualname__', kind.__name__)!s}"] += count
    return named


def referrer_chain(target: object, depth: int = 8, ignore: tuple = ()) -> list[str]:
    """Who keeps `target` alive: each step the first referrer that is not this probe's own frame or list, described
    by its type (and, for a dict, the key that holds the previous step; for an object, its attribute)."""
    import types

    chain: list[str] = []
    current, seen = target, {id(target), id(chain), *(id(i) for i in ignore)}
    for _ in range(depth):
        referrers = [r for r in gc.get_referrers(current) if id(r) not in seen]
        seen.add(id(referrers))
        referrers = [r for r in referrers if not (isinstance(r, list) and len(r) > 100_000)]  # gc.get_objects()
        holders = [r for r in referrers if not isinstance(r, types.FrameType)]
        if not holders:  # only frames: a suspended generator's, a traceback's, or this probe's own (the current one)
            frames = [r for r in referrers if isinstance(r, types.FrameType) and r is not sys._getframe()]
            frames = [f for f in frames if f.f_code.co_filename != __file__]
            if not frames:
                chain.append("(no more referrers)")
                break
            frame = frames[0]
            chain.append(f"frame {frame.f_code.co_qualname} at {frame.f_code.co_filename}:{frame.f_lineno}")
            seen.add(id(frame))
            current = frame
            continue
        holder = min(holders, key=lambda r: isinstance(r, list | tuple | types.CellType))  # containers last
        where = ""
        if isinstance(holder, dict):
            where = next((f" key {k!r:.80}" for k, v in holder.items() if v is current), "")
            owners = [o for o in gc.get_referrers(holder) if getattr(o, "__dict__", None) is holder]
            if owners:  # an object's attribute dict: name the object and the attribute
                chain.append(f"{type(owner := owners[0]).__module__}.{type(owner).__qualname__}.{where.strip()}")
                seen.update({id(holder), id(owner)})
                current = owner
                continue
        chain.append(f"{type(holder).__module__}.{type(holder).__qualname__}{where} ({len(holders)} referrers)")
        seen.add(id(holder))
        current = holder
    return chain


def _holds(value: object, target: object, depth: int) -> bool:
    """Does `value` reach `target` within `depth` steps through containers and instance attributes?"""
    if value is target:
        return True
    if depth == 0 or isinstance(value, str | bytes | int | float | type(None)):
        return False
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, list | tuple | set | frozenset):
        children = list(value)[:1000]
    else:
        children = list(getattr(value, "__dict__", {}).values())
    return any(_holds(child, target, depth - 1) for child in children)


def frames_holding(target: object, depth: int = 3) -> list[str]:
    """The running threads' frames and suspended generators whose locals reach `target` (within `depth` steps):
    where a chain of referrers ends at a cell, the holder is a frame that gc cannot see (a running one)."""
    import types

    names = {thread.ident: thread.name for thread in threading.enumerate()}
    found = []
    for ident, top in sys._current_frames().items():
        frame: types.FrameType | None = top
        while frame is not None:
            if frame.f_code.co_filename != __file__:
                for name, value in list(frame.f_locals.items()):
                    if _holds(value, target, depth):
                        where = f"{frame.f_code.co_qualname} at {frame.f_code.co_filename}:{frame.f_lineno}"
                        found.append(f"thread {names.get(ident, ident)}: {where}, local {name!r}")
            frame = frame.f_back
    for generator in (o for o in gc.get_objects() if isinstance(o, types.GeneratorType)):
        frame = generator.gi_frame
        if frame is not None and any(_holds(v, target, depth) for v in list(frame.f_locals.values())):
            found.append(
                f"suspended generator {frame.f_code.co_qualname} at {frame.f_code.co_filename}:{frame.f_lineno}"
            )
    return found


def chase(type_names: list[str], samples: int = 3) -> list[str]:
    """referrer_chain for the newest few objects of each named type (module.qualname)."""
    lines = []
    for name in type_names:
        found = [o for o in gc.get_objects() if f"{type(o).__module__}.{type(o).__qualname__}" == name]
        for obj in found[-samples:]:
            lines.append(f"## who holds a {name} ({len(found)} alive)")
            lines += [f"   <- {step}" for step in referrer_chain(obj, ignore=(found, lines))]
            lines += [f"   in {where}" for where in frames_holding(obj)]
        del found
    return lines


class Probe:
    """Owns one daemon thread; samples every `every_s` seconds into DIR/samples.jsonl, and every `snapshot_s`
    seconds after `warmup_s` writes DIR/diff-<seconds>.txt: tracemalloc's and gc's growth since the baseline."""

    def __init__(self, folder: Path, every_s: float, snapshot_s: float, warmup_s: float, frames: int) -> None:
        self.folder, self.every_s, self.snapshot_s, self.warmup_s = folder, every_s, snapshot_s, warmup_s
        self.frames = frames
        self.started = time.monotonic()
        self.ready_at: float | None = None
        self.baseline = self.previous = None
        self.baseline_types: collections.Counter | None = None
        self.previous_types: collections.Counter | None = None
        self.next_snapshot = warmup_s

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        threading.Thread(target=self._run, name="rss-probe", daemon=True).start()

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # the server keeps going; the driver finds why the samples stopped
            import traceback

            (self.folder / f"probe-error-{os.getpid()}.txt").write_text(traceback.format_exc())

    def _loop(self) -> None:
        while True:
            elapsed = time.monotonic() - self.started
            if self.ready_at is None and _ready():
                self.ready_at = elapsed
                if self.frames > 0:
                    import tracemalloc

                    tracemalloc.start(self.frames)
            since_ready = None if self.ready_at is None else elapsed - self.ready_at
            row = sample() | {"s": round(elapsed, 1), "since_ready": since_ready, "pid": os.getpid()}
            with (self.folder / "samples.jsonl").open("a") as out:
                out.write(json.dumps(row) + "\n")
            if since_ready is not None and since_ready >= self.next_snapshot:
                self._snapshot(since_ready)
                self.next_snapshot += self.snapshot_s
            asked = self.folder / SNAPSHOT_REQUEST
            if since_ready is not None and asked.exists():  # a driver's request, at a moment of its choosing
                self._snapshot(since_ready)
                asked.unlink(missing_ok=True)  # done: the driver waits for this
            time.sleep(self.every_s)

    def _snapshot(self, elapsed: float) -> None:
        import tracemalloc

        if os.environ.get("RSS_PROBE_COLLECT") == "1":  # how much of the growth was garbage waiting for a collection
            before = sample()
            found = gc.collect()
            after = sample()
            with (self.folder / "collections.jsonl").open("a") as out:
                out.write(json.dumps({"since_ready": elapsed, "unreachable": found, "before": before, "after": after}))
                out.write("\n")
        counts = type_counts()
        snapshot = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
        if snapshot is not None:
            snapshot = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
        if self.baseline_types is None:
            self.baseline, self.baseline_types = snapshot, counts
            self.previous, self.previous_types = snapshot, counts
            return
        lines = [f"# pid {os.getpid()}, {elapsed:.0f} s after ready"]
        for name, old, old_types in (
            ("since the baseline", self.baseline, self.baseline_types),
            ("since the previous snapshot", self.previous, self.previous_types),
        ):
            lines.append(f"# growth {name}")
            grown = sorted(((counts[k] - old_types.get(k, 0), k) for k in counts), reverse=True)[:20]
            lines += ["## gc objects by type (count growth, now)"]
            lines += [f"{d:+8d} {counts[k]:8d} {k}" for d, k in grown]
            if snapshot is not None and old is not None:
                lines.append("## tracemalloc by line (size growth, count growth)")
                for stat in snapshot.compare_to(old, "lineno")[:25]:
                    lines.append(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d} {stat.traceback[0]}")
                lines.append("## tracemalloc by traceback (top 6)")
                for stat in snapshot.compare_to(old, "traceback")[:6]:
                    lines.append(f"{stat.size_diff / 1024:+10.1f} KiB {stat.count_diff:+8d}")
                    lines += [f"      {frame}" for frame in stat.traceback.format()[-16:]]
        self.previous, self.previous_types = snapshot, counts
        wanted = [name for name in os.environ.get("RSS_PROBE_CHASE", "").split(",") if name]
        lines += chase(wanted)
        (self.folder / f"diff-{os.getpid()}-{elapsed:05.0f}.txt").write_text("\n".join(lines) + "\n")


def start_from_env() -> None:
    """Called by the driver's sitecustomize.py in every Python process it starts; samples only the server."""
    folder = os.environ.get("RSS_PROBE_DIR")
    if not folder or not sys.argv or not sys.argv[0].endswith("app.py"):
        return
    Probe(
        Path(folder),
        every_s=float(os.environ.get("RSS_PROBE_EVERY_S", "5")),
        snapshot_s=float(os.environ.get("RSS_PROBE_SNAPSHOT_S", "120")),
        warmup_s=float(os.environ.get("RSS_PROBE_WARMUP_S", "180")),
        frames=int(os.environ.get("RSS_PROBE_TRACEMALLOC_FRAMES", "0")),
    ).start()


def _ready() -> bool:
    """Does the server on PORT say it is ready on /readyz?"""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{os.environ.get('PORT', '7860')}/readyz", timeout=5) as answer:
            return json.loads(answer.read(4096)).get("ready") is True
    except (OSError, ValueError):
        return False
