"""Progress bars: tqdm, or nothing when progress is off."""

from __future__ import annotations


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, total: int | None, desc: str, unit: str, delay: float = 0.0):  # noqa: ANN202 - tqdm or a no-op
    """A progress bar on stderr (tqdm, removed when done; ``delay``: shown only after that many seconds)."""
    if not enabled:
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True, delay=delay)
