"""Which vector copy of the kernel a policy runs: the fastest one measured on this machine, not the widest.

The kernel is compiled in several copies (AVX-512, AVX2+FMA+F16C, SSE2; mlp_core.h) and until now ran the
widest this CPU executes. The widest is not always the fastest: on the AMD Zen 5 kind the AVX-512 copy took
5.23 us per call on rsl_rl's 48-512-256-128-12 where the AVX2 copy took 4.62 (issue #47). So, as FFTW's
planner and oneDNN's dispatch do, the copy is chosen by timing each one on the actual shape, dtype and weight
storage, once per machine: the choice and the times behind it are kept in a small cache file and recorded
wherever the policy is described (the model's status, summary.json, the report).

``isa`` settings: ``"fastest"`` (measure, or take the cached measurement), ``"widest"`` (the old rule), or a
copy's name (``"avx512"``, ``"avx2"``, ``"sse2"``): forced, never overridden. The candidates measured are
``"auto"`` (the old rule: the widest copy, or mlp_core.h's small compile-time-shaped AVX2 kernels where its rule
takes them) and each copy this CPU runs, forced.
"""
from __future__ import annotations

import hashlib
import json
import os
import time

import numpy as np

COPIES = ("avx512", "avx2", "sse2")
SETTINGS = ("fastest", "widest") + COPIES
#: timing: ROUNDS rounds, each copy CALLS back-to-back calls per round (round-robin: drift hits all copies alike)
ROUNDS, CALLS = 9, 200
#: a copy must beat the widest by more than this to be chosen instead (below it the two are the same speed,
#: and the widest is what earlier runs measured)
MARGIN = 0.03
#: bumped when the kernels change how fast a copy runs (3: paired bf16 and the two-panel pass, issue #47), so a
#: machine's cached choices are measured again rather than kept from the old kernels
CACHE_VERSION = 3


AUTO = "auto"


def available() -> list:
    """The candidates on this CPU (and build): "auto" (the old rule), then each copy it runs, widest first."""
    from control_node.kernels._policy import isa_missing
    return [AUTO] + [c for c in COPIES if isa_missing(c) is None]


def _policy(spec, copy, storage):
    from control_node.kernels import Policy
    return Policy(spec, isa=None if copy == AUTO else copy, weights=storage)


def machine_key() -> str:
    """The CPU this measurement holds for: model name and feature flags (a VM can change kind between runs)."""
    model, flags = "", ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k == "model name" and not model:
                    model = v.strip()
                elif k == "flags" and not flags:
                    flags = v.strip()
                if model and flags:
                    break
    except OSError:
        pass
    return model + "|" + hashlib.sha256(flags.encode()).hexdigest()[:16]


def shape_key(spec, storage) -> str:
    """What the times depend on: the layer sizes, activations, dtype, recurrent kind, head and weight storage."""
    return json.dumps([spec.layer_sizes, spec.activations, spec.dtype, spec.recurrent, spec.head, storage])


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "control-node", "kernel-copies.json")


def _read_cache(path) -> dict:
    try:
        with open(path) as f:
            d = json.load(f)
        return d if isinstance(d, dict) and d.get("version") == CACHE_VERSION else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path, key, entry) -> None:
    """Add one entry, atomically (several processes may measure at once; the last write wins, each whole)."""
    d = _read_cache(path) or {"version": CACHE_VERSION, "entries": {}}
    d.setdefault("entries", {})[key] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(d, f)
        os.replace(tmp, path)
    except OSError:
        pass            # a read-only home: measured again next time, nothing lost


def measure(spec, storage=None, copies=None, rounds=ROUNDS, calls=CALLS, run=None) -> dict:
    """{copy: ns per call} (the median over rounds of each round's mean) for each copy in ``copies`` (default:
    :func:`available`), each a Policy of ``spec`` with ``storage`` weights. ``run(copy, policy, x, out)``: one
    call (default ``policy.act_into(x, out)``; a test slows one copy down through it)."""
    from control_node.kernels.reference import random_inputs
    copies = list(copies or available())
    pols = {c: _policy(spec, c, storage) for c in copies}
    x = np.ascontiguousarray(random_inputs(spec, 1, seed=3)[0])
    out = {c: np.zeros(p.n_actions) for c, p in pols.items()}
    call = run or (lambda c, p, xx, o: p.act_into(xx, o))
    samples = {c: [] for c in copies}
    for c in copies:                 # warm: caches, branch predictors, the weights in their level
        for _ in range(calls):
            call(c, pols[c], x, out[c])
    for _ in range(rounds):
        for c in copies:
            p, o = pols[c], out[c]
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                call(c, p, x, o)
            samples[c].append((time.perf_counter_ns() - t0) / calls)
    for p in pols.values():
        p.reset()
    return {c: float(np.median(v)) for c, v in samples.items()}


def choose(times: dict) -> str:
    """The fastest candidate of ``times``, unless it beats "auto" (the old rule) by no more than MARGIN."""
    base = AUTO if AUTO in times else next(c for c in COPIES if c in times)
    best = min(times, key=times.get)
    return best if times[best] < times[base] * (1 - MARGIN) else base


def policy_for(spec, isa="fastest", storage=None, cache=True, run=None):
    """(Policy, choice): the Policy of ``spec`` on the copy the ``isa`` setting picks, and what picked it:
    {setting, copy (requested), isa (what runs: Policy.isa), times_ns, source ("measured" / "cache" /
    "forced" / "widest"), machine}."""
    from control_node.kernels import Policy
    if isa not in SETTINGS:
        raise ValueError(f"isa {isa!r}: use one of {', '.join(SETTINGS)}")
    storage = storage or spec.weights or "f32"
    choice = {"setting": isa, "times_ns": None, "machine": machine_key()}
    if isa in COPIES:
        pol = Policy(spec, isa=isa, weights=storage)
        choice.update(copy=isa, source="forced")
    elif isa == "widest":
        pol = Policy(spec, weights=storage)
        choice.update(copy=None, source="widest")
    else:
        key = choice["machine"] + "|" + shape_key(spec, storage)
        path = cache_path()
        hit = _read_cache(path).get("entries", {}).get(key) if cache else None
        if hit and set(hit.get("times_ns", {})) == set(available()) and hit.get("copy") in available():
            times, source = hit["times_ns"], "cache"
        else:
            times, source = measure(spec, storage, run=run), "measured"
            if cache and run is None:
                _write_cache(path, key, {"copy": choose(times), "times_ns": times, "when": time.time()})
        pol = _policy(spec, choose(times), storage)
        choice.update(copy=choose(times), source=source, times_ns=times)
    choice["isa"] = pol.isa
    return pol, choice


def load(path, isa="fastest", max_bytes=None):
    """``Policy.load(path)`` on the copy the ``isa`` setting picks (:data:`SETTINGS`), verified against the
    reference; ``policy.copy_choice`` records how it was picked (:func:`policy_for`)."""
    from control_node.kernels import Policy
    from control_node.kernels.reference import check_consistency
    if isa not in SETTINGS:
        raise ValueError(f"isa {isa!r}: use one of {', '.join(SETTINGS)}")
    if isa in COPIES:
        policy = Policy.load(path, isa=isa, max_bytes=max_bytes)
        policy.copy_choice = {"setting": isa, "copy": isa, "source": "forced", "isa": policy.isa, "times_ns": None,
                              "machine": machine_key()}
        return policy
    first = Policy.load(path, verify=False, max_bytes=max_bytes)      # read, imported and laid out once
    policy, choice = policy_for(first.spec, isa)
    policy.copy_choice = choice
    check_consistency(policy, policy.spec)
    return policy
