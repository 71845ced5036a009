"""Checkpoints named by Hugging Face Hub id, resolved through ``huggingface_hub``'s cache.

Wherever a checkpoint is named (``act_node``'s ``model_path``, ``--checkpoint`` of the
command-line tools), :func:`resolve_checkpoint` turns the name into a local directory:

- an existing local path is used as it is (a local path always wins, ``models/foo`` too);
- otherwise a name of the form ``org/name[@revision][/subfolder...]`` is a Hub id
  (``revision``: a branch, a tag or a 40-hex commit; without one, ``main``), resolved with
  :func:`huggingface_hub.snapshot_download`: with the Hub reachable the snapshot is
  downloaded once into the cache (``$HF_HUB_CACHE``, by default
  ``~/.cache/huggingface/hub``); offline (``HF_HUB_OFFLINE=1``) the cached snapshot is used;
- anything else stays a local path, which the checkpoint checks then report missing.

A Hub id that cannot be resolved raises one :class:`~act_ros.core.errors.CheckpointError`
line naming the id, the revision and how to fetch it. Only the checkpoint's own folder is
downloaded (the repository root, or the subfolder, without folders below it). Nothing here
imports ``huggingface_hub`` unless a name is a Hub id (the node's inference-process parent
stays light). See ``docs/hub_ids.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
import os
from pathlib import Path
import re

from act_ros.core.errors import CheckpointError

DEFAULT_REVISION = 'main'
# org/name, then an optional @revision (no '/': a branch, a tag or a commit hash), then
# optional subfolders. Each part is checked again by huggingface_hub's validate_repo_id.
_HUB_ID = re.compile(r'(?P<repo>[^/@\s]+/[^/@\s]+)(?:@(?P<revision>[^/@\s]+))?'
                     r'(?P<subfolder>(?:/[^/@\s]+)*)/?')
COMMIT = re.compile(r'[0-9a-f]{40}')
SYNTAX = 'org/name[@revision][/subfolder]'
logger = logging.getLogger(__name__)
_logged: set[tuple[str, str]] = set()  # (name, commit) already logged by this process


@dataclass(frozen=True)
class HubId:
    """A parsed Hub id: repository, revision (``main`` unless given) and subfolder."""

    repo_id: str
    revision: str
    subfolder: str = ''  # '' or 'a/b', relative to the repository root
    revision_given: bool = False

    def fetch_command(self) -> str:
        return f'hf download {self.repo_id} --revision {self.revision}'


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Where a checkpoint name points: ``path`` is always a local directory to read.

    For a Hub id, ``repo_id``, ``revision`` (as asked, ``main`` by default) and ``commit``
    (the snapshot's commit hash) say which; for a local path they are ``None``.
    """

    spec: str  # the name as given
    path: Path
    repo_id: str | None = None
    revision: str | None = None
    commit: str | None = None
    subfolder: str = ''

    @property
    def from_hub(self) -> bool:
        return self.repo_id is not None

    @property
    def pinned(self) -> str:
        """The name with the revision replaced by the commit (the same files everywhere);
        for a local checkpoint, its absolute path."""
        if not self.from_hub:
            return str(self.path.resolve())
        return f'{self.repo_id}@{self.commit}' + (f'/{self.subfolder}' if self.subfolder else '')

    def describe(self) -> str:
        """``'org/name@main'`` plus where it came from, for logs (one line)."""
        if not self.from_hub:
            return f"'{self.spec}'"
        return (f"'{self.spec}' (Hub {self.repo_id}, revision {self.revision}, commit "
                f'{self.commit}, {self.path})')

    def as_values(self) -> dict[str, str]:
        """Key/values for ``/diagnostics`` (``checkpoint.*``); the Hub keys for Hub ids only."""
        values = {'checkpoint.source': self.spec, 'checkpoint.path': str(self.path)}
        if self.from_hub:
            values.update({'checkpoint.repo_id': self.repo_id,
                           'checkpoint.revision': self.revision,
                           'checkpoint.commit': self.commit})
        return values


def parse_hub_id(spec: str) -> HubId | None:
    """The Hub id ``spec`` names, or ``None`` when it is not of the form
    ``org/name[@revision][/subfolder...]`` (absolute and ``./``, ``~`` paths never are)."""
    text = str(spec).strip()
    if not text or text.startswith(('/', '.', '~')) or '\\' in text:
        return None
    match = _HUB_ID.fullmatch(text)
    if match is None:
        return None
    parts = [p for p in match['subfolder'].split('/') if p]
    if any(p in ('.', '..') for p in parts):
        return None
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(match['repo'])
    except HFValidationError:
        return None
    return HubId(repo_id=match['repo'], revision=match['revision'] or DEFAULT_REVISION,
                 subfolder='/'.join(parts), revision_given=match['revision'] is not None)


def resolve_checkpoint(spec: str | os.PathLike) -> ResolvedCheckpoint:
    """The local directory a checkpoint name points to (see the module docstring).

    An existing local path, or a name that is not a Hub id, comes back as a local path
    (checked later like any checkpoint directory). A Hub id comes back as its cached
    snapshot (downloaded when the Hub is reachable), or raises :class:`CheckpointError`.
    """
    text = os.fspath(spec)
    local = Path(text).expanduser()
    if local.exists():
        return ResolvedCheckpoint(spec=text, path=local)
    hub = parse_hub_id(text)
    if hub is None:
        return ResolvedCheckpoint(spec=text, path=local)
    snapshot = _snapshot(text, hub)
    path = snapshot / hub.subfolder if hub.subfolder else snapshot
    where = f"Hub checkpoint '{hub.repo_id}' (revision {hub.revision}, commit {snapshot.name})"
    if not path.is_dir():
        raise CheckpointError(f"{text}: {where} has no folder '{hub.subfolder}' "
                              f'(snapshot {snapshot})')
    resolved = ResolvedCheckpoint(spec=text, path=path, repo_id=hub.repo_id,
                                  revision=hub.revision, commit=snapshot.name,
                                  subfolder=hub.subfolder)
    if (text, resolved.commit) not in _logged:  # the tools' logs name the commit, once
        _logged.add((text, resolved.commit))
        logger.info('checkpoint %s', resolved.describe())
    return resolved


def in_hub_cache(path: str | os.PathLike) -> bool:
    """Whether ``path`` lies inside a snapshot of a ``huggingface_hub`` cache
    (``.../models--org--name/snapshots/<commit>/...``): files there are not ours to add."""
    parts = Path(path).parts
    return any(COMMIT.fullmatch(parts[i]) and parts[i - 1] == 'snapshots'
               and parts[i - 2].startswith('models--') for i in range(2, len(parts)))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f'{type(exc).__name__}: {text[0]}' if text else type(exc).__name__


def _snapshot(spec: str, hub: HubId) -> Path:
    """The snapshot folder of ``hub`` in the cache, downloaded when the Hub is reachable."""
    import httpx
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    prefix = f'{hub.subfolder}/' if hub.subfolder else ''

    def fetch(local_only: bool) -> Path:
        # The checkpoint's own files: its folder, not the folders below it (a training
        # run's other checkpoints, say). Offline, only the cache is looked at (by itself
        # snapshot_download would still ask the Hub for the file list of a commit).
        return Path(snapshot_download(hub.repo_id, revision=hub.revision,
                                      allow_patterns=[f'{prefix}*'],
                                      ignore_patterns=[f'{prefix}*/*'],
                                      local_files_only=local_only))

    offline = bool(constants.HF_HUB_OFFLINE)
    missing: LocalEntryNotFoundError | None = None
    unreachable: BaseException | None = None
    try:
        return fetch(offline)
    except LocalEntryNotFoundError as exc:  # not cached (or incomplete), nothing downloaded
        missing, unreachable = exc, exc.__cause__
    except RevisionNotFoundError:
        raise CheckpointError(f"{spec}: the Hub repository '{hub.repo_id}' has no revision "
                              f"'{hub.revision}'") from None
    except RepositoryNotFoundError as exc:  # GatedRepoError too
        raise CheckpointError(
            f"{spec}: not a local directory, and the Hub repository '{hub.repo_id}' cannot be "
            f"read (missing, private or gated; 'hf auth login' for a private one; "
            f'{_first_line(exc)})') from None
    except (httpx.TransportError, ConnectionError) as exc:  # a commit, the Hub unreachable
        unreachable = exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        status = getattr(getattr(exc, 'response', None), 'status_code', 0) or 0
        if status < 500:
            raise CheckpointError(
                f"{spec}: Hub checkpoint '{hub.repo_id}' (revision {hub.revision}) could not "
                f'be downloaded ({_first_line(exc)})') from None
        unreachable = exc  # the Hub is down: the cache may still have it
    if missing is None:
        try:
            return fetch(True)
        except LocalEntryNotFoundError as exc:
            missing = exc
    raise CheckpointError(_not_cached(spec, hub, constants, missing, offline, unreachable))


def _not_cached(spec: str, hub: HubId, constants, exc: BaseException, offline: bool,
                unreachable: BaseException | None) -> str:
    """One line: what the cache lacks, why nothing was downloaded and how to fetch it."""
    from huggingface_hub import errors
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(constants.HF_HUB_CACHE).expanduser()
    storage = cache / repo_folder_name(repo_id=hub.repo_id, repo_type='model')
    what = f"Hub checkpoint '{hub.repo_id}' (revision {hub.revision})"
    ref = storage / 'refs' / hub.revision
    if isinstance(exc, getattr(errors, 'IncompleteSnapshotError', ())):  # huggingface_hub>=1.x
        problem = f'{what}: the cached snapshot is incomplete ({_first_line(exc)})'
    elif COMMIT.fullmatch(hub.revision) and storage.is_dir():
        problem = (f'{what}: snapshot {hub.revision} is not in the Hugging Face cache '
                   f'({storage / "snapshots"})')
    elif ref.is_file():
        commit = ref.read_text().strip()
        problem = (f'{what}: refs/{hub.revision} in the Hugging Face cache names commit {commit}, '
                   f'whose snapshot is missing ({storage / "snapshots" / commit})')
    elif storage.is_dir():
        problem = f'{what}: the Hugging Face cache has no refs/{hub.revision} ({storage})'
    else:
        problem = f'not a local directory, and {what} is not in the Hugging Face cache ({cache})'
    if offline:
        how = (f"HF_HUB_OFFLINE is set: fetch it with '{hub.fetch_command()}' "
               'or unset HF_HUB_OFFLINE')
    else:
        reason = f' ({_first_line(unreachable)})' if unreachable is not None else ''
        how = (f"the Hub could not be reached{reason}: fetch it with "
               f"'{hub.fetch_command()}' where it can")
    return f'{spec}: {problem}; {how}'
