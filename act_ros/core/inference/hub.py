"""Where a checkpoint name points: a local directory, or a Hugging Face Hub id.

Wherever a checkpoint is named (``act_node``'s ``model_path``, ``--checkpoint`` of the
command-line tools), :func:`resolve_checkpoint` turns the name into a local directory:

- an absolute path (or ``~/...``) is that path;
- a relative path is looked up in the working directory, then in the package's
  ``models/`` folder (``models/foo`` and ``foo`` both find ``<share>/models/foo``;
  ``./foo`` and ``../foo`` mean the working directory only); the first that exists is used;
- a name found nowhere is a Hub id only when it cannot be a local path: it has the form
  ``org/name[@revision][/subfolder...]`` and its first part is neither a folder there
  (in the working directory or the package's ``models/``) nor ``models``. It is resolved
  with :func:`huggingface_hub.snapshot_download` (``revision``: a branch, a tag or a 40-hex
  commit; without one, ``main``): with the Hub reachable the snapshot is downloaded once
  into the cache (``$HF_HUB_CACHE``, by default ``~/.cache/huggingface/hub``); offline
  (``HF_HUB_OFFLINE=1``) the cached snapshot is used;
- any other name is a missing local path: one :class:`~act_ros.core.errors.CheckpointError`
  line names where it was looked for and why it was not taken as a Hub id.

The result says which it was taken as and from where (:meth:`ResolvedCheckpoint.describe`,
in ``act_node``'s configured line; logged once per process). A Hub id that cannot be
resolved raises one line naming the id, the revision and how to fetch it. Only the
checkpoint's own folder is downloaded (the repository root, or the subfolder, without
folders below it). Nothing here imports ``huggingface_hub`` unless a name is a Hub id (the
node's inference-process parent stays light). See ``docs/hub_ids.md``.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

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
    # A local path: where it was found ('as given' for an absolute path, 'the working
    # directory', "the package's models/ folder").
    found_in: str = 'as given'
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
        """The name as given, what it was taken as and where it came from, for logs (one
        line): ``'models/x' (local path in the working directory: /abs/models/x)`` or
        ``'org/name' (Hub org/name, revision main, commit ..., <cache path>)``."""
        if not self.from_hub:
            return f"'{self.spec}' (local path {self.found_in}: {self.path.resolve()})"
        return (f"'{self.spec}' (Hub {self.repo_id}, revision {self.revision}, commit "
                f'{self.commit}, {self.path})')

    def as_values(self) -> dict[str, str]:
        """Key/values for ``/diagnostics`` (``checkpoint.*``); the Hub keys for Hub ids only."""
        values = {'checkpoint.source': self.spec, 'checkpoint.path': str(self.path),
                  'checkpoint.taken_as': 'hub id' if self.from_hub else 'local path'}
        if not self.from_hub:
            values['checkpoint.found_in'] = self.found_in
        else:
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


WORKING_DIRECTORY = 'in the working directory'
PACKAGE_MODELS = "in the package's models/ folder"
MODELS = 'models'


def package_models_dir() -> Path | None:
    """The package's ``models/`` folder (source tree or install), ``None`` if there is none."""
    from act_ros.core.paths import share_dir

    try:
        folder = share_dir() / MODELS
    except FileNotFoundError:
        return None
    return folder if folder.is_dir() else None


def local_candidates(spec: str, *, models_dir: Path | None = None) -> list[tuple[str, Path]]:
    """Where a relative name is looked for, in order: ``(where, path)`` pairs (the working
    directory, then the package's ``models/`` folder unless the name starts with ``./`` or
    ``../``). An absolute or ``~`` path is only itself."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if path.is_absolute():
        return [('as given', path)]
    out = [(WORKING_DIRECTORY, path)]
    parts = Path(text).parts
    explicit = text in (os.curdir, os.pardir) or text.startswith(
        tuple(prefix + sep for prefix in (os.curdir, os.pardir) for sep in ('/', os.sep)))
    if models_dir is not None and parts and not explicit:
        inside = parts[1:] if parts[0] == MODELS and len(parts) > 1 else parts
        out.append((PACKAGE_MODELS, models_dir.joinpath(*inside)))
    return out


def resolve_checkpoint(spec: str | os.PathLike | ResolvedCheckpoint, *,
                       models_dir: Path | None | bool = True) -> ResolvedCheckpoint:
    """The local directory a checkpoint name points to (see the module docstring).

    ``models_dir``: the package's ``models/`` folder to look in (``True``: the package's own,
    :func:`package_models_dir`; ``None``: none). A local directory comes back as it was
    found; a Hub id as its cached snapshot (downloaded when the Hub is reachable); a name
    found nowhere that cannot be a Hub id raises :class:`CheckpointError` saying where it
    was looked for. A checkpoint resolved already comes back as it is (resolved once, it is
    handed on: the runtime to the checkpoint's readers).
    """
    if isinstance(spec, ResolvedCheckpoint):
        return spec
    text = os.fspath(spec)
    models = package_models_dir() if models_dir is True else (models_dir or None)
    candidates = local_candidates(text, models_dir=models)
    for where, path in candidates:
        if path.exists():
            resolved = ResolvedCheckpoint(spec=text, path=path, found_in=where)
            _log_once(text, str(path.resolve()), resolved)
            return resolved
    hub = parse_hub_id(text)
    local_reason = _local_reason(text, hub, candidates, models)
    if local_reason is not None:
        raise CheckpointError(local_reason)
    snapshot = _snapshot(text, hub)
    path = snapshot / hub.subfolder if hub.subfolder else snapshot
    where = f"Hub checkpoint '{hub.repo_id}' (revision {hub.revision}, commit {snapshot.name})"
    if not path.is_dir():
        raise CheckpointError(f"{text}: {where} has no folder '{hub.subfolder}' "
                              f'(snapshot {snapshot})')
    resolved = ResolvedCheckpoint(spec=text, path=path, repo_id=hub.repo_id,
                                  revision=hub.revision, commit=snapshot.name,
                                  subfolder=hub.subfolder)
    _log_once(text, resolved.commit, resolved)  # the tools' logs name the commit, once
    return resolved


def _log_once(text: str, key: str, resolved: ResolvedCheckpoint) -> None:
    if (text, key) not in _logged:
        _logged.add((text, key))
        logger.info('checkpoint %s', resolved.describe())


def _local_reason(text: str, hub: HubId | None, candidates: list[tuple[str, Path]],
                  models: Path | None) -> str | None:
    """Why a name found nowhere is a missing local path (one line), or ``None`` when it is
    taken as a Hub id."""
    if candidates[0][0] == 'as given':  # an absolute path
        return f'{text}: checkpoint directory does not exist (a Hub checkpoint is named {SYNTAX})'
    looked = ' and '.join(f'{where} ({path.absolute()})' for where, path in candidates)
    head = f'{text}: checkpoint directory does not exist (looked {looked})'
    if hub is None:
        return f'{head}; a Hub checkpoint is named {SYNTAX}'
    if hub.revision_given:
        return None  # org/name@revision: a Hub id
    first = Path(text).parts[0]
    folders = [Path(first)] + ([models / first] if models is not None else [])
    local = [str(folder) for folder in folders if folder.is_dir()]
    if first == MODELS or local:
        what = (f"'{first}' is the package's models/ folder" if first == MODELS
                else f"'{first}' is a local folder ({local[0]})")
        return (f'{head}; not taken as a Hub id: {what} (a Hub id whose first part is a '
                f'local folder needs an explicit revision, {hub.repo_id}@main)')
    return None


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
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

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
