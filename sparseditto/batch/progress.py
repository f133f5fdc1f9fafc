"""The batch's live progress: a rich bar on stderr (layers done of all, time, the current layer)
and one line per finished layer; a no-op when progress is off (and in worker processes)."""
from __future__ import annotations

from sparseditto.batch.models import LayerResult


class Progress:
    """A rich progress bar on stderr (layers done / to do, the current layer and what happened)."""

    def __init__(self, enabled: bool, total: int):
        self.bar = None
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

    def working(self, name: str, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, description=f"{name}: {what}")

    def done(self, layer: LayerResult) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)
            self.bar.console.print(f"  {layer.name}: {layer.status} {layer.template or ''} {layer.reason[:100]}",
                                   highlight=False, markup=False)
