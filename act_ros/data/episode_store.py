"""Episodes saved one at a time (a recording session), each readable as soon as it is saved.

Layout for a dataset at ``OUTPUT``:

- ``.OUTPUT.episodes/episode_NNNNNN/``: one LeRobot v3 dataset per saved episode, written
  atomically (:class:`~act_ros.data.writer.AtomicDatasetWriter`): it exists complete or
  not at all;
- ``OUTPUT``: every saved episode in one dataset, rebuilt after each save by LeRobot's
  ``aggregate_datasets`` (videos and tables concatenated, nothing re-encoded) in a
  staging directory and moved into place, so it too is always complete.

A crash or SIGINT while an episode is being recorded loses only that episode; one during
a save leaves the episodes saved before it (the next session's first save, or
:meth:`EpisodeStore.rebuild`, brings ``OUTPUT`` up to date). A new session on the same
``OUTPUT`` continues the numbering.
"""

from __future__ import annotations

import logging
from pathlib import Path
import shutil
import tempfile

from act_ros.core.atomic import replace_dir
from act_ros.data.episode import DatasetLayout, Episode

logger = logging.getLogger(__name__)
SHARD_PREFIX = 'episode_'


class EpisodeStore:
    """Saved episodes of ``output`` (see the module docstring)."""

    def __init__(self, output: str | Path, layout: DatasetLayout) -> None:
        self.output = Path(output).expanduser().absolute()
        self.layout = layout
        self.shards = self.output.parent / f'.{self.output.name}.episodes'
        if self.output.exists() and not self.shards.is_dir():
            raise FileExistsError(f'{self.output} exists and was not written by a recording '
                                  f'session (no {self.shards}); choose another output')

    def saved(self) -> list[Path]:
        """The complete episode datasets, in order."""
        if not self.shards.is_dir():
            return []
        return sorted(p for p in self.shards.iterdir() if p.name.startswith(SHARD_PREFIX)
                      and (p / 'meta' / 'info.json').is_file())

    def next_index(self) -> int:
        saved = self.saved()
        return int(saved[-1].name[len(SHARD_PREFIX):]) + 1 if saved else 0

    def needs_rebuild(self) -> bool:
        """Whether ``output`` lacks saved episodes (a session stopped during a save)."""
        import json

        saved = self.saved()
        if not saved:
            return False
        info = self.output / 'meta' / 'info.json'
        if not info.is_file():
            return True
        return int(json.loads(info.read_text()).get('total_episodes', -1)) != len(saved)

    def save(self, episode: Episode) -> int:
        """Write ``episode`` as the next saved episode and rebuild ``output``; its index."""
        from act_ros.data.writer import AtomicDatasetWriter

        index = self.next_index()
        self.shards.mkdir(parents=True, exist_ok=True)
        shard = self.shards / f'{SHARD_PREFIX}{index:06d}'
        with AtomicDatasetWriter(self.layout, shard) as writer:
            writer.add_episode(episode)
        self.rebuild()
        return index

    def rebuild(self) -> Path:
        """Aggregate every saved episode into ``output`` (atomically replaced)."""
        from lerobot.datasets.aggregate import aggregate_datasets

        saved = self.saved()
        if not saved:
            raise ValueError(f'no saved episode in {self.shards}')
        staging = Path(tempfile.mkdtemp(prefix=f'.{self.output.name}.rebuild-',
                                        dir=self.output.parent))
        built = staging / 'dataset'
        try:
            aggregate_datasets(repo_ids=[f'local/{p.name}' for p in saved],
                               aggr_repo_id=f'local/{self.output.name}', roots=saved,
                               aggr_root=built)
            replace_dir(built, self.output)  # readers always find a complete dataset
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        logger.info('%s: %d episode(s)', self.output, len(saved))
        return self.output
