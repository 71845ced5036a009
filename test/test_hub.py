"""Checkpoints named by Hub id resolve through a huggingface_hub cache laid out here by hand
(``models--org--name/{refs, snapshots/<commit>, blobs}``); nothing touches the network
(``HF_HUB_OFFLINE=1``, see conftest.py)."""

import hashlib
import os
from pathlib import Path

import pytest

from act_ros.core.errors import CheckpointError
from act_ros.core.inference.hub import in_hub_cache, parse_hub_id, resolve_checkpoint

REPO = 'test-org/act_tiny'
COMMIT = 'a' * 40
OTHER = '0123456789abcdef0123456789abcdef01234567'
GONE = 'f' * 40


def populate(cache: Path, source: Path, *, repo: str = REPO, commit: str = COMMIT,
             refs: dict[str, str] | None = None, subfolder: str = '') -> Path:
    """Put ``source``'s files into ``cache`` as snapshot_download does: content in
    ``blobs/<sha256>``, relative symlinks in ``snapshots/<commit>/[subfolder/]``, each ref a
    file holding the commit. Returns the snapshot's checkpoint folder."""
    storage = cache / ('models--' + repo.replace('/', '--'))
    folder = storage / 'snapshots' / commit / subfolder
    folder.mkdir(parents=True, exist_ok=True)
    (storage / 'blobs').mkdir(exist_ok=True)
    for item in sorted(source.iterdir()):
        if not item.is_file():
            continue
        data = item.read_bytes()
        blob = storage / 'blobs' / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (folder / item.name).symlink_to(os.path.relpath(blob, folder))
    (storage / 'refs').mkdir(exist_ok=True)
    for ref, target in (refs if refs is not None else {'main': commit}).items():
        (storage / 'refs' / ref).write_text(target)  # no newline, like huggingface_hub
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty huggingface_hub cache for this test (read by snapshot_download at call time;
    the environment variable for any child process)."""
    from huggingface_hub import constants

    path = tmp_path / 'hf_cache'
    path.mkdir()
    monkeypatch.setenv('HF_HUB_CACHE', str(path))
    monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(path))
    assert constants.HF_HUB_OFFLINE  # conftest.py: no test reaches the Hub
    return path


def test_id_resolves_to_the_snapshot_refs_main_names(cache, tiny_checkpoint):
    from act_ros.core.inference.checkpoint import load_checkpoint

    folder = populate(cache, tiny_checkpoint)
    resolved = resolve_checkpoint(REPO)
    assert resolved.path == folder
    assert (resolved.repo_id, resolved.revision, resolved.commit) == (REPO, 'main', COMMIT)
    assert resolved.as_values()['checkpoint.commit'] == COMMIT
    loaded = load_checkpoint(REPO)  # through the blob symlinks
    assert loaded.path == folder and loaded.source.commit == COMMIT
    assert loaded.chunk_size == 30


def test_the_runtime_resolves_an_id_once_and_hands_it_on(cache, tiny_checkpoint):
    """The runtime's resolution reaches the loader and the JSON reader as it is: the model
    loaded knows the commit it came from (a second resolution of the snapshot's directory
    would know a local path only)."""
    from act_ros.core.inference.checkpoint_info import read_checkpoint_info
    from act_ros.core.inference.runtime import PolicyRuntime, RuntimeConfig

    folder = populate(cache, tiny_checkpoint)
    with PolicyRuntime(RuntimeConfig(model_path=REPO, device='cpu', execution='sync',
                                     warmup=False)) as rt:
        assert rt.checkpoint.source is rt.source, rt.checkpoint.source
        assert rt.source.commit == COMMIT and rt.info.path == folder
    assert resolve_checkpoint(rt.source) is rt.source
    assert read_checkpoint_info(rt.source, rt.contract).path == folder


def test_id_at_a_branch_and_at_a_commit(cache, tiny_checkpoint):
    populate(cache, tiny_checkpoint, refs={'main': COMMIT})
    folder = populate(cache, tiny_checkpoint, commit=OTHER, refs={'main': COMMIT, 'v2': OTHER})
    branch = resolve_checkpoint(f'{REPO}@v2')
    assert (branch.path, branch.revision, branch.commit) == (folder, 'v2', OTHER)
    pinned = resolve_checkpoint(f'{REPO}@{OTHER}')  # a commit needs no ref
    assert (pinned.path, pinned.revision, pinned.commit) == (folder, OTHER, OTHER)
    assert branch.pinned == f'{REPO}@{OTHER}'


def test_id_with_a_subfolder(cache, tiny_checkpoint):
    from act_ros.core.contract import load_contract
    from act_ros.core.inference.checkpoint import read_checkpoint_info

    folder = populate(cache, tiny_checkpoint, subfolder='pretrained_model')
    for spec in (f'{REPO}/pretrained_model', f'{REPO}@main/pretrained_model',
                 f'{REPO}@{COMMIT}/pretrained_model/'):
        resolved = resolve_checkpoint(spec)
        assert (resolved.path, resolved.commit, resolved.subfolder) == (
            folder, COMMIT, 'pretrained_model'), spec
    info = read_checkpoint_info(f'{REPO}/pretrained_model', load_contract())
    assert info.path == folder
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(f'{REPO}/checkpoints/last')
    print(err.value)
    assert str(err.value) == (
        f"{REPO}/checkpoints/last: Hub checkpoint '{REPO}' (revision main, commit {COMMIT}) "
        f"has no folder 'checkpoints/last' (snapshot {folder.parent})")


def _error(spec: str, **kwargs) -> str:
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(spec, **kwargs)
    line = str(err.value)
    print(line)  # the lines quoted in docs/hub_ids.md
    assert '\n' not in line
    return line


def test_stale_refs_main_fails_with_one_line_naming_id_revision_and_fetch(cache, tiny_checkpoint):
    populate(cache, tiny_checkpoint, refs={'main': GONE})  # main moved; its snapshot never came
    storage = cache / 'models--test-org--act_tiny'
    assert _error(REPO) == (
        f"{REPO}: Hub checkpoint '{REPO}' (revision main): refs/main in the Hugging Face cache "
        f'names commit {GONE}, whose snapshot is missing ({storage}/snapshots/{GONE}); '
        f"HF_HUB_OFFLINE is set: fetch it with 'hf download {REPO} --revision main' or unset "
        'HF_HUB_OFFLINE')


def test_missing_snapshot_or_ref_fails_with_one_line(cache, tiny_checkpoint):
    populate(cache, tiny_checkpoint)
    storage = cache / 'models--test-org--act_tiny'
    assert _error(f'{REPO}@{GONE}') == (
        f"{REPO}@{GONE}: Hub checkpoint '{REPO}' (revision {GONE}): snapshot {GONE} is not in "
        f"the Hugging Face cache ({storage}/snapshots); HF_HUB_OFFLINE is set: fetch it with "
        f"'hf download {REPO} --revision {GONE}' or unset HF_HUB_OFFLINE")
    assert _error(f'{REPO}@v9') == (
        f"{REPO}@v9: Hub checkpoint '{REPO}' (revision v9): the Hugging Face cache has no "
        f"refs/v9 ({storage}); HF_HUB_OFFLINE is set: fetch it with "
        f"'hf download {REPO} --revision v9' or unset HF_HUB_OFFLINE")


def test_id_not_cached_at_all(cache):
    assert _error('test-org/never_fetched@v1') == (
        "test-org/never_fetched@v1: not a local directory, and Hub checkpoint "
        f"'test-org/never_fetched' (revision v1) is not in the Hugging Face cache ({cache}); "
        "HF_HUB_OFFLINE is set: fetch it with 'hf download test-org/never_fetched "
        "--revision v1' or unset HF_HUB_OFFLINE")


def test_a_local_directory_named_like_an_id_wins(cache, tiny_checkpoint, tmp_path, monkeypatch):
    populate(cache, tiny_checkpoint)
    local = tmp_path / 'test-org' / 'act_tiny'
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    resolved = resolve_checkpoint(REPO)
    assert resolved.path == Path(REPO) and not resolved.from_hub
    assert resolved.found_in == 'in the working directory'
    # Not an id (absolute, ./relative, one part): the local-path error, with the syntax.
    for spec in (str(tmp_path / 'nope'), './nope/x', 'nope'):
        assert parse_hub_id(spec) is None
        assert 'a Hub checkpoint is named org/name[@revision][/subfolder]' in _error(spec)
    from act_ros.core.inference.checkpoint import load_checkpoint
    with pytest.raises(CheckpointError, match=r'does not exist \(a Hub checkpoint is named '
                       r'org/name\[@revision\]\[/subfolder\]\)'):
        load_checkpoint(tmp_path / 'nope')


# ---- where a relative name is looked for, and when it is a Hub id --------------------------

@pytest.fixture
def no_hub(monkeypatch):
    """Fails the test if anything asks huggingface_hub for a snapshot."""
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError(f'asked the Hub for {args} {kwargs}')

    monkeypatch.setattr(huggingface_hub, 'snapshot_download', refuse)


def _copy(checkpoint: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(checkpoint, to)
    return to


def test_a_relative_name_is_found_in_the_working_directory_first(tiny_checkpoint, tmp_path,
                                                                  monkeypatch, no_hub):
    models = tmp_path / 'share_models'
    _copy(tiny_checkpoint, models / 'my_policy')
    work = tmp_path / 'work'
    _copy(tiny_checkpoint, work / 'models' / 'my_policy')
    monkeypatch.chdir(work)
    resolved = resolve_checkpoint('models/my_policy', models_dir=models)
    assert resolved.path == Path('models/my_policy') and not resolved.from_hub
    assert resolved.found_in == 'in the working directory'
    assert resolved.describe() == ("'models/my_policy' (local path in the working directory: "
                                   f"{work / 'models' / 'my_policy'})")
    assert resolved.as_values()['checkpoint.taken_as'] == 'local path'


@pytest.mark.parametrize('name', ['models/my_policy', 'my_policy'])
def test_then_in_the_package_models_folder(name, tiny_checkpoint, tmp_path, monkeypatch, no_hub):
    """``model_path: models/my_policy`` launched from another directory: the package's
    models/ folder, never the Hub."""
    models = tmp_path / 'share_models'
    _copy(tiny_checkpoint, models / 'my_policy')
    monkeypatch.chdir(tmp_path)
    resolved = resolve_checkpoint(name, models_dir=models)
    assert resolved.path == models / 'my_policy' and not resolved.from_hub
    assert resolved.found_in == "in the package's models/ folder"
    assert resolved.describe().endswith(
        f"(local path in the package's models/ folder: {models / 'my_policy'})")
    # ./ and ../ mean the working directory only.
    assert _error(f'./{name}', models_dir=models).startswith(
        f'./{name}: checkpoint directory does not exist (looked in the working directory '
        f'({tmp_path / name}))')


def test_the_shipped_models_are_found_by_name_from_any_directory(tmp_path, monkeypatch, no_hub):
    from act_ros.core.inference.hub import package_models_dir

    monkeypatch.chdir(tmp_path)
    resolved = resolve_checkpoint('models/sim_port_pick_align_poses')
    assert resolved.path == package_models_dir() / 'sim_port_pick_align_poses'
    assert (resolved.path / 'config.json').is_file()


def test_a_missing_local_name_is_not_taken_as_a_hub_id(tmp_path, monkeypatch, no_hub):
    """A name whose first part is the models folder or a local folder cannot be a Hub id:
    one line says where it was looked for and why."""
    models = tmp_path / 'share_models'
    (models / 'arm').mkdir(parents=True)
    (tmp_path / 'runs').mkdir()
    monkeypatch.chdir(tmp_path)
    assert _error('models/my_policy', models_dir=models) == (
        'models/my_policy: checkpoint directory does not exist (looked in the working '
        f"directory ({tmp_path / 'models' / 'my_policy'}) and in the package's models/ folder "
        f"({models / 'my_policy'})); not taken as a Hub id: 'models' is the package's models/ "
        'folder (a Hub id whose first part is a local folder needs an explicit revision, '
        'models/my_policy@main)')
    assert "'runs' is a local folder (runs)" in _error('runs/best', models_dir=models)
    assert "'arm' is a local folder" in _error('arm/v2', models_dir=models)


def test_a_name_that_cannot_be_local_is_a_hub_id(cache, tiny_checkpoint, tmp_path, monkeypatch):
    """No such folder anywhere: org/name is a Hub id; with a revision it is one even when
    its first part is a local folder."""
    folder = populate(cache, tiny_checkpoint)
    (tmp_path / 'test-org').mkdir()
    monkeypatch.chdir(tmp_path)
    assert "'test-org' is a local folder" in _error(REPO, models_dir=None)
    resolved = resolve_checkpoint(f'{REPO}@main', models_dir=None)
    assert resolved.from_hub and resolved.path == folder
    assert resolved.as_values()['checkpoint.taken_as'] == 'hub id'
    monkeypatch.chdir(tmp_path / 'test-org')
    assert resolve_checkpoint(REPO, models_dir=None).path == folder


def test_parse_hub_id():
    assert parse_hub_id('lerobot/act_aloha@v1.0/pretrained_model') == parse_hub_id(
        'lerobot/act_aloha@v1.0/pretrained_model/')
    hub = parse_hub_id('lerobot/act_aloha@v1.0/a/b')
    assert (hub.repo_id, hub.revision, hub.subfolder) == ('lerobot/act_aloha', 'v1.0', 'a/b')
    for bad in ('org--x/name', 'org/na me', 'org/name@', 'org/name/../x', 'org/-name', '~/x/y'):
        assert parse_hub_id(bad) is None, bad


def test_online_the_checkpoint_folder_is_downloaded_once(cache, tiny_checkpoint, monkeypatch):
    """With the Hub reachable, snapshot_download fetches the checkpoint's own folder (not the
    folders below it); a stand-in plays the Hub here."""
    import huggingface_hub
    from huggingface_hub import constants

    calls = []

    def fake_snapshot_download(repo_id, *, revision, allow_patterns, ignore_patterns,
                               local_files_only):
        calls.append((repo_id, revision, allow_patterns, ignore_patterns, local_files_only))
        return str(populate(cache, tiny_checkpoint, subfolder='pretrained_model').parent)

    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', False)
    monkeypatch.setattr(huggingface_hub, 'snapshot_download', fake_snapshot_download)
    resolved = resolve_checkpoint(f'{REPO}/pretrained_model')
    assert calls == [(REPO, 'main', ['pretrained_model/*'], ['pretrained_model/*/*'], False)]
    assert resolved.commit == COMMIT and in_hub_cache(resolved.path)


@pytest.mark.ros
def test_node_configured_with_a_hub_id_reports_the_commit(cache, tiny_checkpoint, rclpy_context):
    """act_node over real rclpy, ``model_path`` a Hub id at a branch with a subfolder:
    configure loads the cached snapshot; /diagnostics names the repo, revision and commit."""
    from rclpy.parameter import Parameter

    from act_ros.ros.harness import RobotHarness, spinning, wait_until
    from act_ros.ros.node.act_node import ActNode

    populate(cache, tiny_checkpoint, subfolder='pretrained_model',
             refs={'main': COMMIT, 'release': COMMIT})
    spec = f'{REPO}@release/pretrained_model'
    # backend torch: an export of a snapshot would go to the user's cache directory.
    params = {'model_path': spec, 'autostart': False, 'torch_threads': 1, 'execution': 'async',
              'backend': 'torch', 'diagnostics_period_s': 0.2}
    node = ActNode(context=rclpy_context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    # Listens to /diagnostics only (no inputs: the node reports ERROR, with every value).
    listener = RobotHarness(context=rclpy_context, joints={}, image=None, rate_hz=None)
    with spinning(rclpy_context, node, listener):
        assert node.start(), node.last_configure_error
        assert wait_until(lambda: listener.latest_diagnostics() is not None, 20.0)
        values = listener.latest_diagnostics()[2]
    assert values['checkpoint.source'] == spec and values['checkpoint.taken_as'] == 'hub id'
    assert (values['checkpoint.repo_id'], values['checkpoint.revision'],
            values['checkpoint.commit']) == (REPO, 'release', COMMIT)
    assert values['checkpoint.path'].endswith(f'snapshots/{COMMIT}/pretrained_model')


@pytest.mark.ros
def test_node_says_where_a_relative_model_path_was_found(tiny_checkpoint, tmp_path, monkeypatch,
                                                         rclpy_context, no_hub):
    """``model_path: policies/tiny`` from the working directory: /diagnostics says it was
    taken as a local path found there; a missing ``models/...`` fails configure with the
    line that says where it was looked for, without asking the Hub."""
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from act_ros.ros.harness import RobotHarness, spinning, wait_until
    from act_ros.ros.node.act_node import ActNode

    _copy(tiny_checkpoint, tmp_path / 'policies' / 'tiny')
    monkeypatch.chdir(tmp_path)
    params = {'model_path': 'policies/tiny', 'autostart': False, 'torch_threads': 1,
              'execution': 'async', 'backend': 'torch', 'diagnostics_period_s': 0.2}
    node = ActNode(context=rclpy_context,
                   parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    listener = RobotHarness(context=rclpy_context, joints={}, image=None, rate_hz=None)
    with spinning(rclpy_context, node, listener):
        assert node.start(), node.last_configure_error
        assert wait_until(lambda: listener.latest_diagnostics() is not None, 20.0)
        values = listener.latest_diagnostics()[2]
    assert (values['checkpoint.taken_as'], values['checkpoint.found_in']) == (
        'local path', 'in the working directory')
    missing = ActNode(context=rclpy_context, parameter_overrides=[
        Parameter('model_path', value='models/my_policy'), Parameter('autostart', value=False)])
    try:
        assert missing.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert missing.last_configure_error.startswith(
            'models/my_policy: checkpoint directory does not exist (looked in the working '
            f"directory ({tmp_path / 'models' / 'my_policy'}) and in the package's models/ "
            'folder'), missing.last_configure_error
        assert 'not taken as a Hub id' in missing.last_configure_error
    finally:
        missing.destroy_node()


@pytest.mark.ros
def test_node_with_an_uncached_hub_id_fails_configure_with_one_line(cache, rclpy_context):
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from act_ros.ros.node.act_node import ActNode

    node = ActNode(context=rclpy_context, parameter_overrides=[
        Parameter('model_path', value='test-org/never_fetched'),
        Parameter('autostart', value=False)])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        error = node.last_configure_error
        assert error.startswith('test-org/never_fetched: not a local directory') and '\n' not in error
        assert "'hf download test-org/never_fetched --revision main'" in error
    finally:
        node.destroy_node()


def test_exports_of_a_hub_snapshot_go_to_the_user_cache(cache, tiny_checkpoint, tmp_path,
                                                        monkeypatch):
    from act_ros.core.inference.export import _writable_export_dir

    folder = populate(cache, tiny_checkpoint)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
    assert in_hub_cache(folder) and not in_hub_cache(tiny_checkpoint)
    assert _writable_export_dir(folder, 'abc') == tmp_path / 'xdg' / 'act_ros' / 'export' / 'abc'
    assert not (folder / 'export').exists()  # nothing added to the huggingface_hub cache


@pytest.mark.parametrize('command', [
    ['evaluate', '--episodes', '1'], ['export'], ['package-model', '--output', 'unused']])
def test_commands_fail_with_the_same_line(cache, command, capsys):
    from act_ros.cli import main

    name, *options = command
    assert main([name, '--checkpoint', 'test-org/never_fetched@v1', *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f'act-ros {name}: test-org/never_fetched@v1: not a local '
                              'directory'), err
    assert err[-1].endswith("fetch it with 'hf download test-org/never_fetched --revision v1' "
                            'or unset HF_HUB_OFFLINE'), err


@pytest.mark.ros
def test_ros_eval_fails_with_the_same_line(cache, capsys):
    pytest.importorskip('rclpy')
    from act_ros.ros.evaluation import ros_eval

    with pytest.raises(SystemExit) as exit_info:
        ros_eval.main(['--checkpoint', 'test-org/never_fetched', '--episodes', '1'])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        '[ros-eval] error: test-org/never_fetched: not a local directory'), err
