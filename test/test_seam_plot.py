"""act-ros plot-seams: a short run of each mode records the commands and their chunks, the
trace it writes draws again, and bad arguments fail with one line."""

import json

import pytest

from act_ros.training.evaluation import seam_plot

pytestmark = pytest.mark.sim


def test_handover_ticks_are_where_the_chunk_changes():
    assert seam_plot.handover_ticks([None, 0, 0, 3, 3, None, 6, 9]) == [3, 7]


def test_run_writes_a_trace_that_draws_again(tiny_checkpoint, tmp_path, capsys):
    trace_path, png = tmp_path / 'trace.json', tmp_path / 'seams.png'
    assert seam_plot.main(['--checkpoint', str(tiny_checkpoint), '--modes', 'chunk,blend',
                           '--episode-steps', '40', '--blend-window', '3', '--seed', '7',
                           '--trace', str(trace_path), '--output', str(png)]) == 0
    trace = json.loads(trace_path.read_text())
    assert trace['provenance']['command'].startswith('act-ros plot-seams')
    assert list(trace['modes']) == ['chunk', 'blend'] and trace['blend_ticks'] == 3
    for mode, record in trace['modes'].items():
        assert len(record['commands']) == len(record['sources']) == 40
        assert all(len(c) == len(trace['joint_names']) for c in record['commands'])
        # The handovers drawn are the ones the seam meter counted (none cut by the end).
        counted = record['seams']['handovers']
        assert 1 <= counted <= len(seam_plot.handover_ticks(record['sources'])), mode
    # chunk mode plays the checkpoint's 30 rows; blend the chunk size less its window
    assert seam_plot.handover_ticks(trace['modes']['chunk']['sources']) == [30]
    assert seam_plot.handover_ticks(trace['modes']['blend']['sources']) == [27]
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b'\x89PNG'
    again = tmp_path / 'again.png'
    assert seam_plot.main(['--from-trace', str(trace_path), '--output', str(again)]) == 0
    assert again.read_bytes()[:4] == b'\x89PNG'
    capsys.readouterr()
    assert seam_plot.main(['--from-trace', str(trace_path), '--joint', 'elbow_x',
                           '--output', str(again)]) == 2
    assert "--joint: 'elbow_x' is not one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        seam_plot.main(['--output', str(png)])
    with pytest.raises(SystemExit):
        seam_plot.main(['--checkpoint', str(tiny_checkpoint), '--modes', 'fast',
                        '--output', str(png)])
