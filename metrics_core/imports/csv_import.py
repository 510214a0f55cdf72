"""A CSV table to one run: a step column, an optional time column, every numeric column a key.

Contract
--------
* The step is the first column named ``step``, ``_step``, ``Step`` or ``global_step``; the time,
  if any, ``wall_time``, ``timestamp``, ``time`` or ``Wall time`` (TensorBoard's own CSV download),
  as seconds since the epoch or ISO-8601 (a time without a zone is UTC).  Without one, every
  record carries the file's modification time.
* Every other column whose cells all read as numbers is a key (``tag_mapping``: ``loss`` lands on
  ``train_loss``, ``val_loss`` on a ``validation`` record...).  An empty cell is a missing value,
  never a zero.  A column with a cell that is not a number is named in a note and not imported
  (cells of an imported column that turn non-numeric later are skipped and counted as such).
* One session, named after the file, ended ``finished``.  Only complete lines (ending in a
  newline) are read; ``import_state`` keeps the bytes imported, so importing again reads only the
  rows added since, into the same session.
"""

from __future__ import annotations

import csv
import io
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath

from metrics_core.imports.event_files import ImportSourceError
from metrics_core.imports.import_report import ImportReport
from metrics_core.imports.import_state import ImportState, SourceFile
from metrics_core.imports.session_sink import SessionSink

SOURCE = "csv"
STEP_COLUMNS = ("step", "_step", "Step", "global_step")
TIME_COLUMNS = ("wall_time", "timestamp", "time", "Wall time")
NUMERIC, TEXT = "numeric", "text"


def run_directory(root: Path, run: str) -> Path:
    """``root / run``, refusing a name that would leave the root."""
    parts = PurePosixPath(run).parts
    if not parts or run.startswith("/") or any(part in ("..", ".") or part.startswith(".") for part in parts):
        raise ImportSourceError(f"run name {run!r}: expected a relative path of plain names inside the root")
    return root.joinpath(*parts)


def number(cell: str) -> float | None:
    """A cell as a float; None for an empty cell; ValueError for text."""
    cell = cell.strip()
    return float(cell) if cell else None


def seconds(cell: str) -> float:
    """A time cell as seconds since the epoch (a number, or ISO-8601)."""
    try:
        return float(cell)
    except ValueError:
        when = datetime.fromisoformat(cell.strip())
        return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def complete_text(path: Path, offset: int) -> tuple[str, int]:
    """The file's complete lines from ``offset`` on, and the offset after them."""
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read()
    end = data.rfind(b"\n") + 1
    try:
        return data[:end].decode("utf-8"), offset + end
    except UnicodeDecodeError as exc:
        raise ImportSourceError(f"{path}: not UTF-8 text ({exc})") from None


def header_of(path: Path) -> tuple[str, int]:
    """The file's first line and the offset after it; refuses a file without a complete one."""
    with open(path, "rb") as file:
        line = file.readline(1 << 20)
    if not line.endswith(b"\n"):
        raise ImportSourceError(f"{path}: no complete header line")
    try:
        return line.decode("utf-8-sig"), len(line)
    except UnicodeDecodeError as exc:
        raise ImportSourceError(f"{path}: not UTF-8 text ({exc})") from None


def import_csv(path: Path, root: Path, *, run: str) -> ImportReport:
    """Import the rows of ``path`` not imported yet into the run ``run`` of ``root`` (module docstring)."""
    report = ImportReport(runs=1)
    run_dir = run_directory(root, run)
    run_dir.mkdir(parents=True, exist_ok=True)
    state = ImportState.load(run_dir, source=SOURCE, origin=str(path))
    state.cut_unsaved(run_dir)
    entry = state.file(path.name)
    if entry is None:
        entry = SourceFile(name=path.name, session_id=f"csv-{path.name}", first_wall=os.stat(path).st_mtime)
        state.files.append(entry)
    header_line, header_end = header_of(path)
    header = next(csv.reader(io.StringIO(header_line)), [])
    step_column = next((header.index(name) for name in STEP_COLUMNS if name in header), None)
    if step_column is None:
        raise ImportSourceError(f"{path}: no step column (one of {', '.join(STEP_COLUMNS)}); columns: {header!r}")
    time_column = next((header.index(name) for name in TIME_COLUMNS if name in header), None)
    text, end = complete_text(path, entry.offset or header_end)
    rows = list(csv.reader(io.StringIO(text)))
    values = [index for index in range(len(header)) if index not in (step_column, time_column)]
    kinds = classify(header, values, rows, state.plugins, report, path)
    bad = Counter()
    sink = SessionSink(run_dir, run_id=run, session_id=entry.session_id)
    try:
        for row in rows:
            try:
                step = int(float(row[step_column]))
                wall = seconds(row[time_column]) if time_column is not None else entry.first_wall
            except (ValueError, IndexError, OverflowError):
                bad["rows without a step or time"] += 1
                continue
            if not entry.started:
                sink.start(step=step, wall_time=wall, resumed_from_step=None, source=path.name)
                entry.started = True
                report.sessions += 1
            for index in values:
                if kinds[header[index]] != NUMERIC or index >= len(row):
                    continue
                try:
                    value = number(row[index])
                except ValueError:
                    bad[f"non-numeric cells of {header[index]}"] += 1
                    continue
                if value is not None:
                    sink.add(step, wall, header[index], value)
                    report.scalars += 1
            entry.last_wall = wall
        entry.records += len(rows)
        entry.offset = end
        if entry.started and (rows or not state.ended):
            sink.end(entry.last_wall)
            state.ended = True
    finally:
        report.records += sink.written
        report.nonfinite += sink.nonfinite
        sink.close()
    report.notes += [f"{path}: skipped {count} {what}" for what, count in sorted(bad.items())]
    state.save(run_dir)
    return report


def classify(
    header: list[str],
    columns: list[int],
    rows: list[list[str]],
    kinds: dict[str, str],
    report: ImportReport,
    path: Path,
) -> dict[str, str]:
    """Each value column's kind, fixed by the first import that saw it (module docstring)."""
    for index in columns:
        name = header[index]
        if name in kinds:
            continue
        kinds[name] = NUMERIC
        for line, row in enumerate(rows, start=2):
            try:
                if index < len(row):
                    number(row[index])
            except ValueError:
                kinds[name] = TEXT
                report.notes.append(
                    f"{path}: column {name!r} is not numeric (line {line}: {row[index][:40]!r}); not imported"
                )
                break
    return kinds
