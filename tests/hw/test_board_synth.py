"""The board top synthesizes for the ULX3S's ECP5-85F and fits its block RAMs and multipliers."""

import pytest

from gemforge.hw.board.platforms import BoardDesign, platform_for, synth_cells


def test_board_designs_elaborate_for_their_platforms(tmp_path):
    for board in ("ulx3s-85f", "icebreaker"):
        plan = platform_for(board).prepare(BoardDesign("tiny", 16 << 10))
        assert "top.il" in plan.files
        constraints = plan.files["top.lpf" if board == "ulx3s-85f" else "top.pcf"]
        assert "uart" in (constraints if isinstance(constraints, str) else constraints.decode())


@pytest.mark.slow
def test_board_top_synthesizes_for_the_ecp5_85f(tmp_path):
    cells = synth_cells("ulx3s-85f", "tiny", 64 << 10, work_dir=tmp_path)
    print(cells)
    assert 0 < cells.get("DP16KD", 0) <= 208 and cells.get("MULT18X18D", 0) <= 156
    assert 0 < cells.get("LUT4", 0) <= 83_640
