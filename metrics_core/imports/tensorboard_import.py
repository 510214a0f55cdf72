"""A TensorBoard logdir to runs: each directory of event files a run, each event file a session.

Contract
--------
* Every directory under LOGDIR holding ``events.out.tfevents.*`` files becomes the run of the same
  relative path under ROOT (LOGDIR itself: the run named after it).  Each scalar tag becomes a key
  (``tag_mapping``), at its step, stamped with its wall time; values are the float32 TensorBoard
  stored, as TensorBoard's reader returns them (``event_files.scalars``).
* **A restart is a session.**  A process writing TensorBoard logs opens an event file of its own, so
  a run killed and restarted has one file per process.  The files become sessions in the order of
  their first wall time (the ``file_version`` record their writer stamps at open).  A later
  session's ``session_start`` is at the step of its first value and says it resumed from there:
  its steps that go back over an earlier session's supersede them exactly as a resumed run of the
  writer does (``read.session_accounting``), so the sessions page, the effective history and the
  lost-work accounting read an imported run as they read a native one.  TensorBoard either draws
  both copies or purges the older points; both are kept here, and the later one counts.
* **How sessions end.**  TensorBoard records no end.  A session followed by a restart has no
  ``session_end``: it is read as a crash, which is what a restart after it says.  When an import
  completes (once, or a follow stopped by SIGTERM), the run's last session ends ``finished`` -- it
  is all the log holds -- unless its file ends on a torn or corrupt record, the mark of a writer
  killed mid-write: then it has no ``session_end`` and reads ``crashed``.  A later import that
  finds the last file grown goes on with its session after that ``session_end`` and ends it
  again.  While ``--follow`` runs, the importer holds the writer lock of each run it has written
  to, so a run still logging reads ``live``; a step whose values reach the file in two flushes of
  the TensorBoard writer, on either side of a look, is then two records at that step.
* **Idempotent.**  ``import_state`` keeps per run the records of each file imported; importing
  again reads only what was added since (a file that did not grow is not opened).  A file that
  grows after a later session began (two writers at once in one directory) cannot extend its
  session, whose records must stay contiguous: what it gained is reported and not imported.
* **Bad input.**  A torn or corrupt record stops its file: every complete record before it is
  imported, and the report names the file and the offset (``event_files.Damage``).  Non-scalar
  values (images, histograms, text, graphs) are counted and skipped, said once per run.
* **Memory** is one step's record and each open file's reader, whatever the logdir's size.

Assumed: one writer per event file, appending; event files are not rewritten.
"""

from __future__ import annotations

import os
import stat
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metrics_core.imports.event_files import EventFile, is_event_file, scalars
from metrics_core.imports.import_report import ImportReport
from metrics_core.imports.import_state import ImportState, SourceFile
from metrics_core.imports.session_sink import SessionSink

SOURCE = "tensorboard"
EVENT_FILE_PREFIX = "events.out.tfevents."
CHECK_STOP_EVERY = 4096  # events between looks at the stop flag: SIGTERM is honoured within a fraction of a second


def discover(logdir: Path) -> dict[str, Path]:
    """Run name -> directory, for every directory under ``logdir`` holding event files."""
    runs = {}
    for directory, subdirectories, files in os.walk(logdir):
        subdirectories[:] = sorted(name for name in subdirectories if not name.startswith("."))
        if any(is_event_file(name) for name in files):
            relative = Path(directory).relative_to(logdir)
            runs[logdir.resolve().name if relative == Path() else relative.as_posix()] = Path(directory)
    return runs


def regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file: a FIFO or a device named like an event file would block
    the loader's open or read forever (another user may write into the logdir)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def session_id(file_name: str) -> str:
    """A session's id from its event file's name: what follows ``events.out.tfevents.`` (the
    writer's start time, host, process id), unique per file and the same on every import."""
    return file_name.removeprefix(EVENT_FILE_PREFIX) or file_name


class RunImport:
    """One TensorBoard run directory into one run of the root (module docstring)."""

    def __init__(self, name: str, source: Path, run_dir: Path, report: ImportReport, *, follow: bool) -> None:
        self.name, self.source, self.run_dir = name, source, run_dir
        self.report, self.follow = report, follow
        run_dir.mkdir(parents=True, exist_ok=True)
        self.state = ImportState.load(run_dir, source=SOURCE, origin=str(source))
        if self.state.cut_unsaved(run_dir):
            report.notes.append(f"{name}: cut the records of an import killed before it saved its state")
        self._readers: dict[str, EventFile] = {}
        self._sink: SessionSink | None = None
        self._sink_of: str | None = None
        self._refused: set[str] = set()
        self._damaged: dict[str, set[int]] = {}  # damage reported, per file: said once

    def _new_files(self) -> None:
        """Add the event files not seen before, ordered by their first wall time."""
        try:
            names = sorted(name for name in os.listdir(self.source) if is_event_file(name))
        except OSError:
            return
        found = []
        for name in names:
            if self.state.file(name) is not None or not regular_file(self.source / name):
                continue
            first = EventFile(self.source / name).first()
            if first is not None:
                found.append(SourceFile(name=name, session_id=session_id(name), first_wall=first.wall_time))
        self.state.files += sorted(found, key=lambda entry: (entry.first_wall, entry.name))

    def step(self, stopping: Callable[[], bool]) -> None:
        """Import what the run's files gained since the last call (or the last import)."""
        self._new_files()
        changed = False
        for index, entry in enumerate(self.state.files):
            path = self.source / entry.name
            try:
                size = os.stat(path).st_size
            except OSError:
                continue
            if size <= entry.offset:
                continue
            later_started = any(other.started for other in self.state.files[index + 1 :])
            if later_started:
                if entry.name not in self._refused:
                    self._refused.add(entry.name)
                    self.report.problems += 1
                    self.report.notes.append(
                        f"{path}: grew after a later event file's session began; its {size - entry.offset} "
                        "new bytes are not imported (a session's records stay contiguous)"
                    )
                continue
            changed |= self._read(index, entry, path, stopping)
            if stopping():
                break
        if changed:
            if self._sink is not None:
                self._sink.flush()
            self.state.save(self.run_dir)

    def _read(self, index: int, entry: SourceFile, path: Path, stopping: Callable[[], bool]) -> bool:
        reader = self._readers.pop(entry.name, None) or EventFile(path, skip=entry.records)
        if self.follow and index == len(self.state.files) - 1:
            # Only the newest file is kept open between looks (its loader keeps its place): an
            # earlier one cannot extend its session once a later one began, and a logdir of many
            # runs must not hold a descriptor per file.
            self._readers = {entry.name: reader}
        skipped = self.report.skipped.setdefault(self.name, Counter())
        plugins, sink, count, found_count = self.state.plugins, None, 0, 0
        # The hot loop: one decoded event per pass, its values handed to the sink (the loader's
        # checksums cost more than everything here together).
        for event in reader.events():
            found, passed = scalars_of(event, plugins)
            for _tag, kind in passed:
                skipped[kind] += 1
            if found:
                step, wall = event.step, event.wall_time
                if sink is None:
                    sink = self._sink_for(index, entry, step, wall)
                for tag, value in found:
                    sink.add(step, wall, tag, value)
                found_count += len(found)
                entry.last_wall = wall
            count += 1
            if count % CHECK_STOP_EVERY == 0 and stopping():
                break  # after the event is written: the reader has counted it as read
        self.report.scalars += found_count
        if not skipped:
            del self.report.skipped[self.name]
        entry.records, entry.offset = max(entry.records, reader.records), max(entry.offset, reader.offset)
        damage = reader.damage()
        was_damaged = entry.damaged
        entry.damaged = damage is not None and (not self.follow or damage.kind == "corrupt")
        if entry.damaged and damage.offset not in self._damaged.get(entry.name, ()):
            self._damaged.setdefault(entry.name, set()).add(damage.offset)
            self.report.problems += 1
            self.report.notes.append(f"{damage.describe(path)}: imported the {entry.records} records before it")
        return count > 0 or entry.damaged != was_damaged

    def _sink_for(self, index: int, entry: SourceFile, step: int, wall_time: float) -> SessionSink:
        """The open session of ``entry``, started at ``step`` if it has not begun."""
        if self._sink is not None and self._sink_of == entry.name:
            return self._sink
        self._close_sink()
        sink = SessionSink(self.run_dir, run_id=self.name, session_id=entry.session_id)
        self._sink, self._sink_of = sink, entry.name
        if not entry.started:
            first = not any(other.started for other in self.state.files[:index])
            sink.start(step=step, wall_time=min(entry.first_wall, wall_time), resumed_from_step=None if first else step,
                       source=entry.name)  # fmt: skip
            entry.started = True
            self.report.sessions += 1
        self.state.ended = False
        return sink

    def _close_sink(self) -> None:
        if self._sink is not None:
            self.report.records += self._sink.written
            self.report.nonfinite += self._sink.nonfinite
            self._sink.close()
            self._sink = self._sink_of = None

    def finish(self) -> None:
        """End the last session as the module docstring says, save the state, let go of the run."""
        started = [entry for entry in self.state.files if entry.started]
        if started and not self.state.ended and not started[-1].damaged:
            last = started[-1]
            self._sink_for(self.state.files.index(last), last, 0, last.last_wall).end(last.last_wall)
            self.state.ended = True
        self._close_sink()
        if started:
            self.state.save(self.run_dir)


def scalars_of(event: Any, plugins: dict[str, str]) -> tuple[list[tuple[str, float]], list[tuple[str, str]]]:
    """An event's scalars and skipped values (``event_files.scalars``), a graph counted as one
    skipped value of its kind."""
    kind = event.WhichOneof("what")
    if kind in ("graph_def", "meta_graph_def", "tagged_run_metadata"):
        return [], [("", kind)]
    return scalars(event, plugins)


def import_logdir(
    logdir: Path, root: Path, *, follow: bool = False, interval: float = 1.0, stop: threading.Event | None = None
) -> ImportReport:
    """Import every run of ``logdir`` into ``root`` (module docstring).  With ``follow``, keep
    importing every ``interval`` seconds until ``stop`` is set (the command sets it on SIGTERM);
    then end each run's last session and let go of its lock."""
    report = ImportReport()
    runs: dict[str, RunImport] = {}
    stop = threading.Event() if stop is None else stop
    try:
        while not stop.is_set():
            for name, source in discover(logdir).items():
                run = runs.get(name)
                if run is None:
                    run = runs[name] = RunImport(name, source, root / name, report, follow=follow)
                run.step(stop.is_set)
                if stop.is_set():
                    break
            if not follow or stop.wait(interval):
                break
    finally:
        for run in runs.values():
            run.finish()
    report.runs = len(runs)
    return report
