"""The batch's live progress: a rich bar on stderr (layers done of all, time, the current layer, an
ETA once one layer of each kind has finished) and one line per finished layer; a no-op when
progress is off (and in worker processes)."""
from __future__ import annotations

from statistics import median

from sparseditto.batch.models import WINNER_STATUSES, LayerResult

SEARCHED = ("searched",)                         # a group's full search
REUSED = ("reused", "previous", "shared")        # a layer started from a kernel found before


class Eta:
    """Seconds left, from what the finished layers took: per group still to do, one full search
    when it has no winner yet (the median search so far) and the median reused layer of that group
    (else of all groups) for each of its other layers. A rate over all layers would mislead: a
    group's first layer takes 10-20x its others (H200, 7B-shaped batch: 50-86 s vs 3-10 s), and
    skipped tensors finish at once."""

    def __init__(self) -> None:
        self.left: dict[str, set[str]] = {}
        self.has_winner: dict[str, bool] = {}
        self.searches: list[float] = []
        self.reused: dict[str, list[float]] = {}

    def plan(self, groups: dict[str, list[str]], done: dict[str, LayerResult]) -> None:
        """The layers each group still has to do (``done``: what a resumed batch finished)."""
        for key, names in groups.items():
            self.left[key] = {n for n in names if n not in done}
            self.has_winner[key] = any(done[n].status in WINNER_STATUSES for n in names if n in done)

    def finished(self, layer: LayerResult) -> None:
        key = layer.group
        if key in self.left:
            self.left[key].discard(layer.name)
        if layer.status in SEARCHED:
            self.searches.append(layer.seconds)
        elif layer.status in REUSED:
            self.reused.setdefault(key or "", []).append(layer.seconds)
        if key is not None and layer.status in WINNER_STATUSES:
            self.has_winner[key] = True

    def seconds_left(self) -> float | None:
        """None until the groups are planned and every kind of layer still to do has been seen once."""
        if not self.left:
            return None
        everyone = [s for v in self.reused.values() for s in v]
        total = 0.0
        for key, names in self.left.items():
            if not names:
                continue
            later = len(names)
            if not self.has_winner.get(key):
                if not self.searches:
                    return None
                total += median(self.searches)
                later -= 1
            if later:
                own = self.reused.get(key) or everyone
                if not own:
                    return None
                total += later * median(own)
        return total


class Progress:
    """A rich progress bar on stderr (layers done / to do, the current layer and what happened)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
        self.eta = Eta()
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold cyan]batch"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TextColumn("{task.description}"), console=Console(stderr=True))
            self.task = self.bar.add_task("", total=total)

    def __enter__(self):
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def plan(self, groups: dict[str, list], done: dict[str, LayerResult]) -> None:
        """The groups still to do, {key: [(weight ref, report)]} as the analysis pass builds them."""
        self.eta.plan({key: [ref.name for ref, _ in members] for key, members in groups.items()}, done)

    def working(self, name: str, what: str) -> None:
        if self.bar is not None:
            left = self.eta.seconds_left()
            eta = f" · ETA ~{left / 60:.0f} min" if left is not None and left >= 90 else (
                f" · ETA ~{left:.0f} s" if left is not None else "")
            self.bar.update(self.task, description=f"{name}: {what}{eta}")

    def done(self, layer: LayerResult) -> None:
        self.eta.finished(layer)
        if self.bar is not None:
            self.bar.advance(self.task)
            self.bar.console.print(f"  {layer.name}: {layer.status} {layer.template or ''} {layer.reason[:100]}",
                                   highlight=False, markup=False)
