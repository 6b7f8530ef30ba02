"""The floor measured on the spot (bench/floor.py and its compiled probe) and how bench policy / bench
recurrent use it: structure, units and the choice between measured and published figures. Behaviour, not
speed: no figure is held to a bound (the host may stall any sample), only to being finite, positive and
consistent with the other figures of the same measurement."""
import ast
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from control_node.bench import floor
from control_node.bench.common import machine_info
from control_node.bench.harness import CHILD_CWD, child_env
from control_node.bench.policy import (FLOORS, SHAPES, floor_from, floor_of, itemsize_of, per_call, report,
                                       shape_figures, storage_bytes, weight_bytes_of)

probe = pytest.importorskip("control_node.bench._floor_probe", reason="the compiled floor probe is not built")

RSL = SHAPES["rsl_rl 48-512-256-128-12 ELU + normaliser"]["sizes"]


def finite_positive(v):
    return v is not None and math.isfinite(v) and v > 0


@pytest.fixture(scope="module")
def measured():
    return floor.measure()


def test_probe_measures_every_level_and_both_dtypes(measured):
    m = measured
    assert m["isa"] == floor.default_isa() and m["isa"] in probe.supported()
    assert m["vector_bytes"] == probe.vector_bytes(m["isa"]) and m["chains"] == probe.CHAINS
    ghz = m["clock"]["ghz"]
    assert finite_positive(ghz) and m["clock"]["spread"] >= 1
    # every level is either measured or says why not; the caches /sys lists are measured
    assert set(m["memory"]) | set(m["skipped"]) == set(floor.LEVELS)
    assert not set(m["memory"]) & set(m["skipped"])
    assert {lv for lv in ("L1", "L2", "L3") if lv in floor.cache_sizes()} <= set(m["memory"])
    for lv, r in m["memory"].items():
        assert finite_positive(r["bytes_per_ns"]), (lv, r)
        assert r["bytes_per_cycle"] == pytest.approx(r["bytes_per_ns"] / ghz)
        assert r["spread"] >= 1 and r["samples"] == floor.ROUNDS * floor.SAMPLES_PER_ROUND[lv]
        assert r["buffer_bytes"] % 512 == 0 and r["passes_per_sample"] >= 1
    for dt, itemsize in (("float32", 4), ("float64", 8)):
        c = m["compute"][dt]
        assert finite_positive(c["fmas_per_ns"]) and c["spread"] >= 1
        assert c["lanes"] == m["vector_bytes"] // itemsize
        assert c["fmas_per_cycle"] == pytest.approx(c["fmas_per_ns"] / ghz)
    assert m["percentile"] == floor.PERCENTILE and m["seconds"] > 0 and "p10" in m["method"]
    assert floor.measure() is m                 # measured once per process
    # narrow weights: the widening loop ran on every x86 copy that has one (AVX2, AVX-512), the fastest kept
    widening = [c for c in probe.supported() if c != "sse2"]
    for st in probe.WIDEN:
        if not widening:
            assert st not in m["compute"]
            continue
        c = m["compute"][st]
        assert c["copy"] in widening and c["lanes"] == probe.vector_bytes(c["copy"]) // 4
        assert finite_positive(c["fmas_per_ns"]) and c["fmas_per_cycle"] == pytest.approx(c["fmas_per_ns"] / ghz)


def test_buffers_sit_in_their_level():
    caches = {"L1": 48 << 10, "L2": 2 << 20, "L3": 105 << 20}
    sizes, skipped = floor.level_buffers(caches, mem_available=16 << 30)
    assert not skipped
    assert sizes["L1"] <= caches["L1"] < sizes["L2"] <= caches["L2"] < sizes["L3"] <= caches["L3"] < sizes["DRAM"]
    assert all(b % 512 == 0 for b in sizes.values())
    # an L3 barely larger than L2 still gets a buffer between the two
    sizes, _ = floor.level_buffers({"L1": 32 << 10, "L2": 1 << 20, "L3": 3 << 19}, mem_available=16 << 30)
    assert (1 << 20) < sizes["L3"] <= (3 << 19)
    # too little memory for a buffer past the last cache: DRAM is skipped, saying why
    sizes, skipped = floor.level_buffers(caches, mem_available=256 << 20)
    assert "DRAM" not in sizes and "free memory" in skipped["DRAM"]
    sizes, skipped = floor.level_buffers({"L1": 32 << 10, "L2": 1 << 20})
    assert "L3" not in sizes and "/sys" in skipped["L3"] and sizes["DRAM"] >= floor.DRAM_MIN_BYTES


def test_level_of_picks_the_smallest_cache_that_holds_the_weights():
    caches = {"L1": 48 << 10, "L2": 2 << 20, "L3": 105 << 20}
    assert [floor.level_of(b, caches) for b in (1000, 48 << 10, (48 << 10) + 1, 3 << 20, 200 << 20)] == \
        ["L1", "L1", "L2", "L3", "DRAM"]


def test_an_unknown_cpu_gets_the_measured_floor(measured):
    fmas, nbytes = 3 * 64 + 64 * 64 + 64, 500_000
    compute, memory, level, how = fl = floor_from(fmas, nbytes, "float32", family=None)
    assert finite_positive(compute) and finite_positive(memory)
    assert level == floor.level_of(nbytes, measured["caches"])
    assert compute == pytest.approx(fmas / measured["compute"]["float32"]["fmas_per_ns"])
    assert memory == pytest.approx(nbytes / measured["memory"][level]["bytes_per_ns"])
    assert how.startswith("measured here (unknown CPU: no published figures): compute ")
    assert "B/ns" in how and "FMAs/ns" in how and "GHz (dependent adds)" in how
    assert fl.detail["used"] == "measured" and fl.detail["published"] is None
    # a family named but not in the table is just as unknown
    assert floor_from(fmas, nbytes, "float32", family="Some CPU").detail["used"] == "measured"


@pytest.mark.parametrize("family", sorted(FLOORS))
def test_a_known_family_reports_both_floors_and_uses_the_measured_one(family, measured):
    """On every CPU the floor is the measured one; a family's published figures are a cross-check computed at
    the clock the probe measured (not /proc/cpuinfo's nominal clock, which a guest states below its boost)."""
    fl = floor_from(100_000, 800_000, "float32", family=family)
    pub, mea = fl.detail["published"], fl.detail["measured"]
    assert fl.detail["used"] == "measured" and fl.detail["family"] == family
    assert tuple(fl[:3]) == (mea["compute"], mea["memory"], mea["cache_level"])
    assert finite_positive(pub["compute"]) and finite_positive(pub["memory"])
    ghz = measured["clock"]["ghz"]
    f = FLOORS[family]
    assert pub["compute"] == pytest.approx(100_000 / (f["fma_units"] * f["vector_bytes"] // 4 * ghz))
    assert fl[3].startswith("measured here: compute") and "; published: compute" in fl[3]
    assert f"{family} at {ghz:.2f} GHz (measured clock)" in fl[3] and f["source"] in fl[3]


def test_float64_computes_at_half_the_float32_lanes(measured):
    f32 = floor_from(10_000, 4096, "float32", family=None)
    f64 = floor_from(10_000, 4096, "float64", family=None)
    assert f32[0] == pytest.approx(10_000 / measured["compute"]["float32"]["fmas_per_ns"])
    assert f64[0] == pytest.approx(10_000 / measured["compute"]["float64"]["fmas_per_ns"])
    assert measured["compute"]["float64"]["lanes"] * 2 == measured["compute"]["float32"]["lanes"]


def test_weight_bytes_of_every_storage():
    W = sum(a * b for a, b in zip(RSL[:-1], RSL[1:]))
    ch = sum(RSL[1:])
    assert weight_bytes_of(RSL, "float32") == (W + ch) * 4
    assert weight_bytes_of(RSL, np.float64) == weight_bytes_of(RSL, "float64") == (W + ch) * 8
    # reduced storage: the matrices narrow, biases stay float32, int8 adds a float32 scale per channel
    assert weight_bytes_of(RSL, "float16") == weight_bytes_of(RSL, "bfloat16") == weight_bytes_of(RSL, 2) \
        == W * 2 + ch * 4
    assert weight_bytes_of(RSL, "int8") == weight_bytes_of(RSL, 1) == W + ch * 4 + ch * 4
    assert storage_bytes(100, 10, "float16", "float64") == 100 * 2 + 10 * 8
    for bad in ("float8", 3, True):
        with pytest.raises(ValueError, match="weight (dtype|itemsize)"):
            itemsize_of(bad)


def test_floor_of_a_reduced_storage_reads_fewer_bytes_at_its_widening_rate(measured):
    sizes = [3, 64, 64, 1]              # small: every storage sits in the same level (L1)
    fmas = 3 * 64 + 64 * 64 + 64
    f32 = floor_of(sizes, "float32")
    for storage, name in (("float16", "f16"), ("bfloat16", "bf16"), ("int8", "int8")):
        fl = floor_of(sizes, "float32", storage=storage)
        # float32 multiply-adds at the rate this core widens and multiply-adds such weights (the probe's
        # widening loop, the fastest copy that has one), or at the float32 rate where none ran
        rate = measured["compute"].get(name, measured["compute"]["float32"])["fmas_per_ns"]
        assert fl[0] == pytest.approx(fmas / rate)
        if name in measured["compute"]:
            assert f"on {name} weights widened" in fl[3]
        level = fl[2]
        assert fl[1] == pytest.approx(weight_bytes_of(sizes, storage) / measured["memory"][level]["bytes_per_ns"])
        assert fl[1] < f32[1]
    # a storage name as floor_from's dtype computes in float32
    assert floor_from(1000, 4096, "float16", family=None)[0] == pytest.approx(
        floor_from(1000, 4096, "float32", family=None)[0])


def test_recurrent_floor_counts_gates_and_storage():
    from control_node.bench.recurrent import SHAPES as RSHAPES
    from control_node.bench.recurrent import floor_of as rfloor_of
    from control_node.bench.recurrent import make_spec
    from control_node.bench.recurrent import weight_bytes_of as rweight_bytes_of
    spec = make_spec(RSHAPES["rsl_rl LSTM(48->256) + 256-128-12 ELU"])
    G, H, n = 4, 256, 48
    W = G * H * (n + H) + 256 * 128 + 128 * 12
    ch = 2 * G * H + 128 + 12
    assert rweight_bytes_of(spec) == (W + ch) * 4
    assert rweight_bytes_of(spec, "float16") == W * 2 + ch * 4
    assert rweight_bytes_of(spec, "int8") == W + ch * 8
    fl = rfloor_of(spec, "float16")
    assert finite_positive(fl[0]) and finite_positive(fl[1]) and fl.detail["measured"] is not None


def test_widening_loop_times_each_storage_where_the_copy_has_it():
    for isa in probe.supported():
        for st in probe.WIDEN:
            t = probe.widen_ns(isa, st, 2, 3)
            if isa == "sse2":
                assert (t == -1).all()          # no widening loop in the SSE2 copy: said, not guessed
            else:
                assert np.isfinite(t).all() and (t > 0).all(), (isa, st, t)
    with pytest.raises(ValueError, match="storage"):
        probe.widen_ns(probe.supported()[0], "f8", 1, 1)


def test_narrower_copy_measures_with_its_own_vectors():
    m = floor.measure("sse2")
    assert m["isa"] == "sse2" and m["vector_bytes"] == 16 and m["compute"]["float32"]["lanes"] == 4


def test_probe_refuses_bad_input_by_name():
    with pytest.raises(ValueError, match="isa: 'neon' is not one of"):
        probe.fma_ns("neon", "float32", 10, 1)
    with pytest.raises(ValueError, match="dtype: 'float16'"):
        probe.fma_ns("sse2", "float16", 10, 1)
    raw = np.zeros(1024 + 16, dtype=np.float32)
    off = (-raw.ctypes.data) % 64 // 4
    with pytest.raises(ValueError, match="64-byte aligned"):
        probe.read_ns(raw[off + 1:off + 1 + 128], "sse2", 1, 1)
    with pytest.raises(ValueError, match="multiple of 128"):
        probe.read_ns(raw[off:off + 100], "sse2", 1, 1)
    with pytest.raises(floor.FloorProbeError, match="isa: 'avx9000' is not one of"):
        floor.measure("avx9000")
    missing = [isa for isa in probe.ISAS if isa not in probe.supported()]
    if missing:
        with pytest.raises(floor.FloorProbeError, match=f"does not run the {missing[0]} copy"):
            floor.measure(missing[0])


def test_report_fills_the_floor_column_on_an_unknown_cpu(capsys):
    """A real kernel row timed, its floor forced unknown-family: the table's floor column is filled."""
    from control_node.bench.policy import make_spec
    from control_node.kernels import Policy
    from control_node.kernels.reference import random_inputs
    cfg = SHAPES["SB3 PPO 3-64-64-1 tanh"]
    spec = make_spec(cfg, "float32")
    pol = Policy(spec)
    x = np.ascontiguousarray(random_inputs(spec, 1, seed=7)[0])
    times = per_call([("kernel Policy.act(x)", pol.act, x)], 5)
    for family, cols in ((None, 1), ("AMD Zen 5", 2)):
        fl = floor_from(sum(a * b for a, b in zip(cfg["sizes"][:-1], cfg["sizes"][1:])),
                        weight_bytes_of(cfg["sizes"], "float32"), "float32", family=family)
        sh = {"shape": "PPO", "dtype": "float32", "isa": pol.isa, **shape_figures(times, fl, 0.0, 0, {})}
        row = sh["rows"][0]
        assert finite_positive(row["vs_floor"]) and finite_positive(row["vs_measured_floor"])
        assert (row["vs_published_floor"] is None) == (family is None)
        report({"machine": machine_info(), "floor_probe": floor.measure(), "shapes": [sh]})
        text = capsys.readouterr().out
        assert "floor measured here" in text and "p50 / measured" in text
        assert ("p50 / published" in text) == (cols == 2)        # (rich may wrap a header)
        assert f"{row['vs_measured_floor']:.2f}" in text
        assert ("floor measured: compute" in text) and (("published (AMD Zen 5)" in text) == (cols == 2))


@pytest.mark.slow
def test_bench_policy_records_the_measured_floor(tmp_path):
    out = tmp_path / "policy.json"
    r = subprocess.run([sys.executable, "-m", "control_node", "bench", "policy", "--shape", "SB3 PPO 3-64-64-1 tanh",
                        "--samples", "5", "--chunks", "5", "--chunk", "20", "--json", str(out)], cwd=CHILD_CWD,
                       env=child_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert set(res["floor_probe"]["memory"]) | set(res["floor_probe"]["skipped"]) == set(floor.LEVELS)
    for sh in res["shapes"]:
        assert sh["floor_ns"]["measured"] and sh["floor_ns"]["used"] in ("measured", "published")
        for row in sh["rows"]:
            assert finite_positive(row["vs_measured_floor"]) and finite_positive(row["vs_floor"]), row
    assert "floor measured here" in r.stdout and "p50 / measured" in r.stdout


def test_without_the_compiled_probe_the_floor_says_why():
    """An install without the probe (a build from before it existed): the bench still runs, the floor says
    it was not measured and how to build it; a known family keeps its published floor."""
    code = ("import sys; sys.modules['control_node.bench._floor_probe'] = None\n"
            "from control_node.bench.policy import floor_from, floor_probe\n"
            "u = floor_from(100, 1000, 'float32', family=None)\n"
            "k = floor_from(100, 1000, 'float32', family='AMD Zen 5')\n"
            "print(repr((tuple(u), u.detail['used'], tuple(k[:3]), k.detail['used'], k[3], floor_probe())))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=CHILD_CWD, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    u, u_used, k, k_used, k_how, probe_said = ast.literal_eval(r.stdout.strip())
    assert u[:3] == (None, None, None) and u_used is None
    assert u[3].startswith("unknown CPU: no published figures (100 FMAs, 1000 weight bytes); not measured: the "
                           "floor probe is not built") and "pip install -e ." in u[3]
    assert k_used == "published" and all(finite_positive(v) for v in k[:2]) and k[2] == "L1"
    assert "; not measured: the floor probe is not built" in k_how
    assert probe_said.startswith("the floor probe is not built")
