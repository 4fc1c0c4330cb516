"""`timing_paths`: the slowest paths of a routed design from an SDF in nextpnr's format
(a hand-written design whose longest paths are worked out below)."""

import pytest

from gemforge.hw.flow.timing_paths import parse_sdf, signal_group, slowest_paths

# Two registers a (2 bits) and b feed a LUT chain into register y; b also feeds z directly.
# Clock-to-out 500 ps, LUT arcs 200 ps, setup 100 ps (the first SETUPHOLD figure; the hold,
# 300 ps, must not count). The names carry nextpnr's mapping suffixes and an escaped dot.
SDF = r"""
(DELAYFILE
  (SDFVERSION "3.0") (DESIGN "top") (VENDOR "nextpnr") (DIVIDER /) (TIMESCALE 1ps)
  (CELL (CELLTYPE "top") (INSTANCE )
    (DELAY (ABSOLUTE
      (INTERCONNECT unit\.a_TRELLIS_FF_Q/Q lut1_LUT4_Z/A (1000:1100:1200) (1000:1100:1200))
      (INTERCONNECT unit\.a_TRELLIS_FF_Q_1/Q lut1_LUT4_Z/B (100:100:100) (100:100:100))
      (INTERCONNECT unit\.b_TRELLIS_FF_Q/Q lut1_LUT4_Z/C (300:300:300) (300:300:300))
      (INTERCONNECT lut1_LUT4_Z/Z lut2_LUT4_Z/A (400:400:400) (400:400:400))
      (INTERCONNECT lut2_LUT4_Z/Z unit\.y_TRELLIS_FF_Q/DI (50:50:50) (50:50:50))
      (INTERCONNECT unit\.b_TRELLIS_FF_Q/Q unit\.z_TRELLIS_FF_Q/DI (700:700:700) (700:700:700))
    ))
  )
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit\.a_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:450:500) (400:450:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (300:300:300))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit\.a_TRELLIS_FF_Q_1)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:450:500) (400:450:500)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit\.b_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:450:500) (400:450:500)))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit\.y_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:450:500) (400:450:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (300:300:300))))
  (CELL (CELLTYPE "TRELLIS_FF") (INSTANCE unit\.z_TRELLIS_FF_Q)
    (DELAY (ABSOLUTE (IOPATH CLK Q (400:450:500) (400:450:500))))
    (TIMINGCHECK (SETUPHOLD (posedge DI) (posedge CLK) (100:100:100) (300:300:300))))
  (CELL (CELLTYPE "LUT4") (INSTANCE lut1_LUT4_Z)
    (DELAY (ABSOLUTE (IOPATH A Z (200:200:200) (200:200:200)) (IOPATH B Z (200:200:200) (200:200:200))
                     (IOPATH C Z (200:200:200) (200:200:200)))))
  (CELL (CELLTYPE "LUT4") (INSTANCE lut2_LUT4_Z)
    (DELAY (ABSOLUTE (IOPATH A Z (200:200:200) (200:200:200)))))
)
"""


def test_slowest_paths_follow_the_longest_arrival_and_add_the_setup():
    paths = slowest_paths(parse_sdf(SDF))
    # a[0] → lut1 → lut2 → y: 500 + 1200 + 200 + 400 + 200 + 50 = 2550, plus setup 100.
    # b → z: 500 + 700 + 100 = 1300. (b → y, 500 + 300 + ..., is slower than a[1] but not than a[0].)
    assert [(p["from"], p["to"], p["delay_ns"], p["endpoints"]) for p in paths] == [
        ("unit.a", "unit.y", 2.65, 1), ("unit.b", "unit.z", 1.3, 1)]
    pins = [step["pin"] for step in paths[0]["path"]]
    assert pins == ["unit.a_TRELLIS_FF_Q.Q", "lut1_LUT4_Z.A", "lut1_LUT4_Z.Z", "lut2_LUT4_Z.A", "lut2_LUT4_Z.Z",
                    "unit.y_TRELLIS_FF_Q.DI"]
    assert paths[0]["path"][-1]["arrival_ns"] == 2.55
    assert len(slowest_paths(parse_sdf(SDF), limit=1)) == 1


def test_signal_groups_name_the_amaranth_signal():
    assert signal_group("load.reader.count_TRELLIS_FF_Q_12") == "load.reader.count"
    assert signal_group("acc_mem.bank0.1.2_DOA16_LUT4_D_Z") == "acc_mem.bank#.#.#_DOA#"
    assert signal_group("\\$signal$437_TRELLIS_FF_Q_15") == "$signal$437"


@pytest.mark.parametrize("text", ["", "(CELL)", "(DELAYFILE (CELL)", "(VERSION 1)"])
def test_malformed_sdf_is_refused(text):
    with pytest.raises(ValueError, match="SDF"):
        parse_sdf(text)
