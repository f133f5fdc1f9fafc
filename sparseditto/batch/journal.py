"""The batch's progress on disk (``OUT/journal.sqlite``, SQLite through sqlite-utils).

Every finished layer is one row, written in its own transaction the moment the layer is done, so
a killed batch (kill -9 included) loses at most the layer that was running. A restarted batch
with ``resume=True`` reads the rows back and redoes nothing finished: a group whose layers are all
recorded is not touched, and a group whose first layer is recorded reuses that layer's winner.
The settings the batch started with are stored too: resuming with other settings would mix two
batches in one report, so it is refused. So is each weight's pattern report as soon as it is
analyzed: a resumed batch of a 7B checkpoint would otherwise load and analyze every unfinished
weight again (1-3 s each on the H200 host) before its first group could start. Like the finished
layers, they assume the model on disk is the one the batch started with.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import sqlite_utils

from sparseditto.batch.models import LayerResult

JOURNAL_NAME = "journal.sqlite"


class Journal:
    """Finished layers of one batch, keyed by tensor name."""

    def __init__(self, out: Path):
        self.path = out / JOURNAL_NAME
        try:
            conn = sqlite3.connect(str(self.path), timeout=30.0)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error as exc:
            raise ValueError(f"Cannot open the batch journal {self.path}: {exc}") from None
        self.db = sqlite_utils.Database(conn)
        if "settings" not in self.db.table_names():
            with self.db.conn:
                self.db["settings"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
                self.db["layers"].create({"name": str, "grp": str, "status": str, "record": str}, pk="name",
                                         if_not_exists=True)
        if "analyses" not in self.db.table_names():   # also added to a journal of an older batch
            with self.db.conn:
                self.db["analyses"].create({"name": str, "report": str}, pk="name", if_not_exists=True)

    def close(self) -> None:
        self.db.conn.close()

    def settings(self) -> dict | None:
        row = next(iter(self.db["settings"].rows_where("key = ?", ["batch"])), None)
        return json.loads(row["value"]) if row else None

    def start(self, settings: dict, resume: bool) -> None:
        """Record the settings of a new batch, or check a resumed one's against them."""
        old = self.settings()
        if old is None:
            with self.db.conn:
                self.db["settings"].insert({"key": "batch", "value": json.dumps(settings, sort_keys=True)})
            return
        if not resume:
            raise ValueError(f"{self.path.parent} already holds a batch ({len(self.done())} layer(s) done); pass "
                             "resume=True (--resume) to continue it, or choose another out folder.")
        changed = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        if changed:
            raise ValueError(f"Cannot resume the batch in {self.path.parent}: its settings differ in {changed} "
                             f"(was {[old.get(k) for k in changed]}, now {[settings.get(k) for k in changed]}); "
                             "use the original settings or another out folder.")

    def record(self, layer: LayerResult) -> None:
        """One finished layer, durably (its own transaction, synchronous=FULL)."""
        with self.db.conn:
            self.db["layers"].upsert({"name": layer.name, "grp": layer.group or "", "status": layer.status,
                                      "record": layer.model_dump_json()}, pk="name")

    def record_analysis(self, name: str, report: dict) -> None:
        """A weight's pattern report (the analysis pass's result), kept for a resume."""
        with self.db.conn:
            self.db["analyses"].upsert({"name": name, "report": json.dumps(report)}, pk="name")

    def analyses(self) -> dict[str, dict]:
        return {row["name"]: json.loads(row["report"]) for row in self.db["analyses"].rows}

    def done(self) -> dict[str, LayerResult]:
        return {row["name"]: LayerResult.model_validate_json(row["record"]) for row in self.db["layers"].rows}
