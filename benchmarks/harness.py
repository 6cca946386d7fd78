"""What the benchmark scripts share: the machine record, the results files, memory and CPU time.

Each ``bench_*.py`` measures its own thing and writes its own tables; this module holds the
plumbing that is the same in all of them, beside ``plotting.py`` (their figures):

* :func:`machine`: the record of the machine a result was measured on, field by field;
* :func:`write_results`: ``<name>.json`` and ``<name>.md`` in the ``--out`` folder;
* :func:`proc_kib`, :class:`PeakMemory`, :func:`cpu_seconds`: the resident memory (and its peak
  during a block) and the CPU time of this process;
* :func:`run_python`, :func:`worker_json`, :func:`median_of_runs`: a measurement in a fresh
  interpreter, its JSON back, and several runs' median;
* :func:`seconds_per_call`, :func:`in_turns`, :func:`median_ratios`: ways timed round-robin,
  each against a reference;
* :func:`parse_size`, :func:`size_label`: ``"200M"`` and back;
* :func:`counted`, :func:`how_often`, :func:`other_work`, :func:`extra_mb`: words of the tables'
  captions and cells, for a reader (``"3 seeds"``, how often a measurement was taken, whether
  other work shared the CPUs, memory a step did not add).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PeakMemory",
    "WorkerError",
    "counted",
    "cpu_seconds",
    "extra_mb",
    "how_often",
    "in_turns",
    "machine",
    "median_of_runs",
    "median_ratios",
    "other_work",
    "parse_size",
    "proc_kib",
    "run_python",
    "seconds_per_call",
    "size_label",
    "worker_json",
    "write_results",
]

GIB = 1 << 30


def _version(package: str) -> str:
    return importlib.metadata.version(package)  # as installed: nothing imported to read it


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# What each field of a machine record holds, read when the record is made.
_FIELDS: dict[str, Callable[[], Any]] = {
    "cpus": os.cpu_count,
    "threads": _torch_threads,  # torch's intra-op threads
    "load": lambda: os.getloadavg()[0],  # the 1-minute load average: other jobs' share
    "memory_gib": lambda: round(proc_kib("MemTotal", "/proc/meminfo") * 1024 / GIB, 1),
    "platform": platform.platform,
    "python": platform.python_version,
    "torch": lambda: _version("torch"),
    "lightning": lambda: _version("lightning"),
    "transformers": lambda: _version("transformers"),
}


def machine(*fields: str) -> dict[str, Any]:
    """The record of this machine that a results file carries: ``fields``, in that order.

    Args:
        fields: Any of ``cpus``, ``threads`` (torch's), ``load`` (1-minute load average),
            ``memory_gib``, ``platform``, ``python``, ``torch``, ``lightning``,
            ``transformers`` (the packages' versions).

    Raises:
        ValueError: If a field is none of these.

    Example:
        >>> record = machine("cpus", "python")
        >>> list(record) == ["cpus", "python"] and record["cpus"] == os.cpu_count()
        True
    """
    unknown = [field for field in fields if field not in _FIELDS]
    if unknown:
        raise ValueError(f"Expected machine fields among {sorted(_FIELDS)}, but got {unknown}.")
    return {field: _FIELDS[field]() for field in fields}


def write_results(folder: Path, name: str, results: Any, table: str) -> None:
    """Write ``results`` to ``folder/<name>.json`` and ``table`` to ``folder/<name>.md``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     write_results(Path(folder), "demo", {"seconds": 1.5}, "| a |\\n")
        ...     sorted(path.name for path in Path(folder).iterdir())
        ['demo.json', 'demo.md']
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (folder / f"{name}.md").write_text(table)


def proc_kib(field: str, path: str = "/proc/self/status") -> int:
    """A ``kB`` field of a ``/proc`` file: ``VmRSS``, ``VmHWM``; ``MemAvailable`` of meminfo.

    Raises:
        RuntimeError: If ``path`` has no such field.

    Example:
        >>> proc_kib("VmRSS") > 0 and proc_kib("MemTotal", "/proc/meminfo") > 0
        True
    """
    for line in Path(path).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in {path}")


def cpu_seconds() -> float:
    """The CPU time of this process so far, every thread's, user and system: unlike the wall
    time, it does not grow while other processes hold the CPUs (a shared machine's noise).

    Example:
        >>> cpu_seconds() > 0
        True
    """
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class PeakMemory:
    """The resident memory before a block, its peak during it, and after it (bytes).

    On Linux the kernel's own peak (``VmHWM``, reset through ``/proc/self/clear_refs``): exact,
    whatever the block allocates and frees between two looks. Elsewhere a thread samples the
    resident memory (``psutil``) every millisecond.

    Example:
        >>> with PeakMemory() as memory:  # written, so resident (a calloc'd block may not be)
        ...     block = b"x" * (1 << 24)
        >>> memory.peak - memory.before >= 1 << 24
        True
    """

    CLEAR_REFS = Path("/proc/self/clear_refs")

    def __init__(self) -> None:
        self.before = self.peak = self.after = 0
        self._kernel = self.CLEAR_REFS.exists() and os.access(self.CLEAR_REFS, os.W_OK)
        self._sampling = False
        self._thread: threading.Thread | None = None

    @property
    def measured_by(self) -> str:
        """How the peak is read: ``"VmHWM"`` (the kernel's) or ``"sampling"``."""
        return "VmHWM" if self._kernel else "sampling"

    def _resident(self) -> int:
        if self._kernel:
            return proc_kib("VmRSS") * 1024
        import psutil

        return int(psutil.Process().memory_info().rss)

    def _sample(self) -> None:
        while self._sampling:
            self.peak = max(self.peak, self._resident())
            time.sleep(0.001)

    def __enter__(self) -> PeakMemory:
        if self._kernel:
            self.CLEAR_REFS.write_text("5")
        self.before = self.peak = self._resident()
        if not self._kernel:
            self._sampling = True
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = self._resident()
        if self._kernel:
            self.peak = proc_kib("VmHWM") * 1024
        else:
            self._sampling = False
            assert self._thread is not None
            self._thread.join()
        # The kernel raises VmHWM lazily (at unmaps, faults): a block that frees pages touched
        # just after the reset can leave it below the resident memory read then.
        self.peak = max(self.peak, self.before, self.after)


class WorkerError(RuntimeError):
    """A fresh process exited with an error; ``output`` holds its stderr (or its stdout)."""

    def __init__(self, args: tuple[str, ...], output: str) -> None:
        shown = " ".join("..." if "\n" in arg else arg for arg in args)  # not a -c program
        super().__init__(f"`python {shown}` failed:\n{output[-3000:]}")
        self.output = output

    @property
    def last_lines(self) -> list[str]:
        """The last line of the output, as a list (empty where there was no output)."""
        return self.output.strip().splitlines()[-1:]


def run_python(*args: str, timeout: float | None = None) -> str:
    """Run this interpreter with ``args`` in a fresh process; what it printed.

    Raises:
        WorkerError: If the process exits with an error.
        subprocess.TimeoutExpired: If it runs past ``timeout`` seconds.

    Example:
        >>> run_python("-c", "print(6 * 7)")
        '42\\n'
    """
    command = [sys.executable, *args]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout)
    if done.returncode != 0:
        raise WorkerError(args, done.stderr or done.stdout)
    return done.stdout


def worker_json(*args: str, timeout: float | None = None) -> Any:
    """Run ``python args`` in a fresh process; the JSON of the last line it printed.

    Raises:
        WorkerError: If the process exits with an error.

    Example:
        >>> worker_json("-c", "print('warming up'); print('{\\"seconds\\": 1.5}')")
        {'seconds': 1.5}
    """
    return json.loads(run_python(*args, timeout=timeout).strip().splitlines()[-1])


def median_of_runs(
    runs: Sequence[Mapping[str, Any]], medians: Sequence[str] = (), firsts: Sequence[str] = ()
) -> dict[str, Any]:
    """The runs of one measurement (fresh processes, say) as one: ``seconds``, their median, and
    ``seconds_all``; then the median of each field of ``medians`` and the first run's value of
    each field of ``firsts`` (what every run has alike: the parameters, the threads).

    Example:
        >>> runs = [{"seconds": 3.0, "params": 8}, {"seconds": 1.0, "params": 8}]
        >>> median_of_runs(runs, firsts=["params"])
        {'seconds': 2.0, 'seconds_all': [3.0, 1.0], 'params': 8}
    """
    return {
        "seconds": statistics.median(run["seconds"] for run in runs),
        "seconds_all": [run["seconds"] for run in runs],
        **{field: statistics.median(run[field] for run in runs) for field in medians},
        **{field: runs[0][field] for field in firsts},
    }


def seconds_per_call(
    call: Callable[[], object], steps: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    """The mean seconds of ``steps`` calls of ``call`` in a row, read on ``clock``.

    Example:
        >>> seconds_per_call(lambda: sum(range(1000)), steps=3) > 0
        True
    """
    start = clock()
    for _ in range(steps):
        call()
    return (clock() - start) / steps


def in_turns(
    calls: Mapping[str, Callable[[], object]],
    rounds: int,
    steps: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Each call's seconds per step, round by round: every round times ``steps`` steps of each
    call, the order rotating by one each round, so that load on a shared machine falls on all.

    Args:
        calls: What to time, by name.
        rounds: How many turns each call takes.
        steps: Calls per turn; a turn's time is their mean.
        clock: ``time.perf_counter`` (wall time) or ``time.thread_time`` (the CPU time of this
            thread: with one torch thread, what other processes do not stretch).

    Example:
        >>> times = in_turns({"a": lambda: None, "b": lambda: None}, rounds=3, steps=2)
        >>> [len(times[name]) for name in times]
        [3, 3]
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    order = list(calls)
    for index in range(rounds):
        shift = index % len(order)
        for name in order[shift:] + order[:shift]:
            times[name].append(seconds_per_call(calls[name], steps, clock))
    return times


def median_ratios(times: Mapping[str, list[float]], reference: str) -> dict[str, float]:
    """Per name, the median over the rounds of each round's time over the reference's turn in
    the same round (load drifts between rounds far more than the overheads measured).

    Example:
        >>> median_ratios({"dense": [1.0, 2.0, 1.0], "lean": [1.1, 2.4, 1.2]}, "dense")
        {'dense': 1.0, 'lean': 1.2}
    """
    return {
        name: statistics.median(t / r for t, r in zip(values, times[reference], strict=True))
        for name, values in times.items()
    }


def parse_size(text: str) -> int:
    """A count written ``"200K"``, ``"50M"``, ``"1.5B"`` (or ``G``) or ``"1000"``.

    Example:
        >>> parse_size("1.5B"), parse_size("200K"), parse_size("1000")
        (1500000000, 200000, 1000)
    """
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
    return int(float(text[:-1]) * scale[text[-1].upper()]) if text[-1].isalpha() else int(text)


def size_label(params: int) -> str:
    """Three significant digits: ``3.02B``, ``134M``, ``983K``.

    Example:
        >>> size_label(3_019_898_880), size_label(134_217_728), size_label(983_040)
        ('3.02B', '134M', '983K')
    """
    if params >= 1e9:
        return f"{params / 1e9:.3g}B"
    return f"{params / 1e6:.3g}M" if params >= 1e6 else f"{params / 1e3:.3g}K"


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one: ``"1 thread"``, ``"3 seeds"``.

    Example:
        >>> counted(1, "thread"), counted(3, "seed"), counted(2, "process")
        ('1 thread', '3 seeds', '2 processes')
    """
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {noun}es" if noun.endswith(("s", "sh", "ch", "x")) else f"{count} {noun}s"


def other_work(load: float, cpus: int) -> str:
    """A caption's sentence saying that other work shared the CPUs, or ``""`` if it did not.

    ``load`` is the 1-minute load average the machine record holds; from half the CPUs up, the
    measured times shared the machine with other programs and vary more than on an idle one.

    Example:
        >>> other_work(5.2, 2)
        'Other programs ran on the machine at the same time, so the times are noisy.'
        >>> other_work(0.3, 2)
        ''
    """
    if load < cpus / 2:
        return ""
    return "Other programs ran on the machine at the same time, so the times are noisy."


def extra_mb(value: float) -> str:
    """Bytes a step added to the resident memory, in MB; ``"none"`` where it added none.

    The resident memory can also fall during a step (the process gives freed memory back),
    which is no negative cost: such a step added nothing.

    Example:
        >>> extra_mb(2_750_000), extra_mb(-16_000_000)
        ('2.8', 'none')
    """
    return f"{value / 1e6:,.1f}" if value > 0 else "none"


def how_often(repeats: int, each: str = "") -> str:
    """How often each measurement was taken, for a caption: once, or the median of several.

    Example:
        >>> how_often(1, "in a fresh process")
        'Each measured once, in a fresh process'
        >>> how_often(3, "in a fresh process")
        'The median of 3 runs, each in a fresh process'
        >>> how_often(3)
        'The median of 3 runs'
    """
    if repeats == 1:
        return "Each measured once" + (f", {each}" if each else "")
    return f"The median of {repeats} runs" + (f", each {each}" if each else "")
