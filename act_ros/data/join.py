"""New episodes appended to a copy of an existing dataset (``act-ros collect --join``).

Expert demonstrations and DAgger iterations are both written the same way: the new
episodes go to a dataset of their own in a scratch directory beside the output, LeRobot's
aggregation writes the base dataset plus them to a second one, and that one is renamed into
place only when complete. The base dataset is never modified, an interrupted run leaves
the output as it was, and the joined dataset keeps the base's card (followed by the new
episodes' card) and its DAgger log.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

DAGGER_LOG = 'dagger_log.jsonl'  # one line per DAgger iteration, beside meta/ in a dataset
# Features every LeRobot dataset has besides the ones it is created with.
INDEX_FEATURES = ('timestamp', 'frame_index', 'episode_index', 'index', 'task_index')


def dataset_info(dataset: Path, flag: str = '--join') -> dict:
    """``meta/info.json`` of a LeRobot dataset, or a clear error naming ``flag``."""
    info = Path(dataset) / 'meta' / 'info.json'
    if not info.is_file():
        raise FileNotFoundError(f'{flag} {dataset}: not a LeRobot dataset (no meta/info.json)')
    return json.loads(info.read_text())


def frame_layout(dataset: Path, camera_feature: str) -> tuple[int, int, bool]:
    """Image height, width and whether frames are videos, as ``dataset`` stores a camera."""
    info = dataset_info(dataset)
    feature = info['features'].get(camera_feature)
    if feature is None:
        raise ValueError(f'--join {dataset}: no camera feature {camera_feature!r}; the '
                         f'dataset has {sorted(info["features"])}')
    return int(feature['shape'][0]), int(feature['shape'][1]), feature['dtype'] == 'video'


def check_joinable(base: Path, new_features: dict) -> None:
    """Refuse a base whose features differ from those the new episodes are written with."""
    have = {k: v for k, v in dataset_info(base)['features'].items()
            if k not in INDEX_FEATURES}
    differ = sorted(k for k in set(have) | set(new_features)
                    if k not in have or k not in new_features
                    or have[k].get('dtype') != new_features[k].get('dtype')
                    or list(have[k].get('shape', ())) != list(new_features[k].get('shape', ())))
    if differ:
        detail = '; '.join(
            f'{k}: dataset {_describe(have.get(k))}, new episodes {_describe(new_features.get(k))}'
            for k in differ)
        raise ValueError(f'--join {base}: its features differ from the episodes being '
                         f'recorded ({detail}); record with the same image size, storage and '
                         'contract, or write a new dataset')


def _describe(feature: dict | None) -> str:
    if feature is None:
        return 'missing'
    return f'{feature.get("dtype")} {list(feature.get("shape", ()))}'


def joined(base: Path, new: Path, scratch: Path, card: str) -> Path:
    """``base`` plus the episodes of ``new`` as a new dataset in ``scratch`` (returned).

    Its README.md is the base's card followed by ``card``; the base's DAgger log is kept.
    """
    from lerobot.datasets.aggregate import aggregate_datasets

    from act_ros.data.writer import fast_image_embedding

    fast_image_embedding()
    merged = scratch / 'merged'
    sources = [Path(base), Path(new)]
    aggregate_datasets(repo_ids=[f'local/{p.name}' for p in sources], roots=sources,
                       aggr_repo_id=f'local/{merged.name}', aggr_root=merged)
    base_card = Path(base) / 'README.md'
    previous = base_card.read_text() if base_card.is_file() else ''
    (merged / 'README.md').write_text(previous + '\n' + card)
    if (Path(base) / DAGGER_LOG).is_file():
        shutil.copyfile(Path(base) / DAGGER_LOG, merged / DAGGER_LOG)
    return merged


def move_into_place(built: Path, output: Path, overwrite: bool, scratch: Path) -> None:
    """Rename the complete dataset ``built`` to ``output`` (an old one only if ``overwrite``)."""
    from act_ros.data.writer import check_output

    previous = scratch / 'previous'
    if output.is_dir():
        if any(output.iterdir()):
            check_output(output, overwrite)
            output.rename(previous)
        else:
            output.rmdir()
    try:
        built.rename(output)
    except OSError:
        if previous.exists() and not output.exists():
            previous.rename(output)
        raise
