"""Run one existing PyPI DataLoader tuner ("peer") the way its own documentation says, on one of
our benchmark pipelines, and report what it picked as JSON.

Run it with the peers' virtual environment (see README.md beside this file), not feedrate's::

    .venv-peers/bin/python benchmarks/peers/run_peer.py --peer loadtune --pipeline tabular \
        --json out.json

Peers:

* ``loadtune`` (0.3.0): ``tune(Workload(...), steps=50, max_trials=6, auto_batch=True)``, the
  README's "Scenario C: The Python API" call on a ``Workload`` ("Scenario B: Native PyTorch").
* ``dataloader-param-helper`` (0.1.1): ``find_optimal_params(dataset, device, batch_size)``, the
  function the package exports (its docstring is the only usage text the wheel ships).

The peer runs in a child process in its own session, with its working directory in a fresh
temporary folder (dataloader-param-helper reads and writes ``dataloader_params.json`` in the
current directory and would otherwise reuse an earlier result). After ``--timeout-s`` seconds
the child's whole process group is killed, and the group is killed after a normal exit too, so
no DataLoader worker is left behind. Any exception from the peer becomes ``ok: false`` with the
exception as ``reason``.

feedrate itself is not needed: ``benchmarks/pipelines.py`` imports ``feedrate.loader.target``
only to import the example files, and this script puts a minimal stand-in for that one function
in ``sys.modules`` before importing the pipelines.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
REPO = BENCHMARKS.parent

PEERS = {"loadtune": "loadtune", "dataloader-param-helper": "dataloader-param-helper"}
ALIASES = {"dph": "dataloader-param-helper", "dataloader_param_helper": "dataloader-param-helper"}
LOG_TAIL_CHARS = 3000


# --- loading our pipelines without feedrate ----------------------------------------------------


def _install_feedrate_shim() -> None:
    """Put a minimal ``feedrate.loader.target`` (and ``feedrate.machine_facts``, which the
    images example calls) in ``sys.modules``: enough for ``benchmarks/pipelines.py``, which
    only loads ``examples/NAME.py:loader`` with it.

    Like feedrate's own, it imports the file under its stem with its folder first on
    ``sys.path``, so DataLoader workers can unpickle the classes it defines."""
    from torch.utils.data import DataLoader

    def load_target(spec: Any) -> Any:
        location, _, name = str(spec).rpartition(":")
        path = Path(location).resolve()
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        module = sys.modules.get(path.stem)
        if module is None or Path(getattr(module, "__file__", "") or "").resolve() != path:
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[path.stem] = module
            module_spec.loader.exec_module(module)
        value: Any = module
        for part in name.split("."):
            value = getattr(value, part)
        if not isinstance(value, DataLoader) and callable(value):
            value = value()
        return value

    def machine_facts() -> Any:
        # The images example sizes itself by feedrate's count of usable CPUs: the count
        # compare.py measured with feedrate (FEEDRATE_PEER_CPUS), else this process's affinity.
        cpus = os.environ.get("FEEDRATE_PEER_CPUS")
        return types.SimpleNamespace(
            cpus_usable=int(cpus) if cpus else len(os.sched_getaffinity(0))
        )

    package = types.ModuleType("feedrate")
    package.__path__ = []  # packages, so "feedrate.loader.target" resolves to the module below
    package.machine_facts = machine_facts  # type: ignore[attr-defined]
    loader = types.ModuleType("feedrate.loader")
    loader.__path__ = []
    target = types.ModuleType("feedrate.loader.target")
    target.load_target = load_target  # type: ignore[attr-defined]
    loader.target = target  # type: ignore[attr-defined]
    package.loader = loader  # type: ignore[attr-defined]
    sys.modules["feedrate"] = package
    sys.modules["feedrate.loader"] = loader
    sys.modules["feedrate.loader.target"] = target


def load_pipeline(name: str) -> Any:
    """The ``Pipeline`` called ``name`` in our ``benchmarks/pipelines.py``."""
    _install_feedrate_shim()
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import pipelines  # benchmarks/pipelines.py

    if name not in pipelines.BY_NAME:
        raise SystemExit(f"unknown pipeline {name!r}; known: {', '.join(pipelines.BY_NAME)}")
    return pipelines.BY_NAME[name]


# --- a training step with no compute, for loadtune's Workload ----------------------------------


def _null_model() -> Any:
    import torch

    class NullModel(torch.nn.Module):
        """One parameter, no real compute: the step measures the input pipeline only."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(()))

    return NullModel()


def _to_device(batch: Any, device: Any) -> Any:
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _null_step(model: Any, optimizer: Any, batch: Any, device: Any) -> Any:
    """loadtune's ``train_step(model, optimizer, batch, device) -> loss``: moves the batch to the
    device (as a real step would), then a trivial backward/step."""
    _to_device(batch, device)
    loss = model.w * 0.0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def _sgd(model: Any) -> Any:
    import torch

    return torch.optim.SGD(model.parameters(), lr=0.0)


# --- the peers ---------------------------------------------------------------------------------


def _finite(value: Any) -> Any:
    """JSON-safe: inf/nan become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def run_loadtune(pipeline: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    from loadtune import Knobs, Workload, tune

    loader = pipeline.factory()
    dataset = loader.dataset
    batch_size = loader.batch_size
    workload = Workload(
        name=pipeline.name,
        make_dataset=lambda: dataset,  # built once; loadtune calls this once per trial
        make_model=_null_model,
        train_step=_null_step,
        make_optimizer=_sgd,
        default_batch_size=batch_size,
        collate_fn=loader.collate_fn,
        description=pipeline.description,
    )
    how = (
        f"tune(Workload(make_dataset=<pipeline dataset>, make_model=<1-parameter null model>, "
        f"train_step=<move batch to device, trivial backward>, default_batch_size={batch_size}, "
        f"collate_fn=<pipeline's>), steps={args.lt_steps}, warmup={args.lt_warmup}, "
        f"max_trials={args.lt_max_trials}, auto_batch=True), as in README 'Scenario C: The "
        f"Python API' (tune(workload, steps=50, max_trials=6, auto_batch=True)) on a "
        f"'Scenario B' Workload; loadtune builds its own DataLoader (shuffle=True, drop_last=True)"
    )
    out["how"] = how
    began = out["_call_began"] = time.perf_counter()
    result = tune(
        workload,
        steps=args.lt_steps,
        warmup=args.lt_warmup,
        max_trials=args.lt_max_trials,
        auto_batch=True,
    )
    wall = time.perf_counter() - began

    baseline = result.baseline
    best = result.best
    improved = best is not None and baseline is not None and best.throughput > baseline.throughput
    # What it picked: its best trial when that beat the baseline (the CLI's "best overall" and
    # --apply rule), else the baseline (Knobs(): num_workers=0), which it keeps.
    knobs = best.knobs if improved else Knobs()
    trials = [
        {
            "knobs": t.knobs.label(),
            "reason": t.reason,
            "throughput": t.throughput if t.ok else None,
            "error": (t.result or {}).get("error"),
        }
        for t in result.trials
    ]
    details = {
        "baseline_knobs": Knobs().label(),
        "baseline_throughput": getattr(baseline, "throughput", None),
        "baseline_data_wait_frac": getattr(baseline, "data_wait_frac", None),
        "baseline_cpu_util_mean": getattr(baseline, "cpu_util_mean", None),
        "baseline_error": getattr(baseline, "error", None),
        "device": getattr(baseline, "device", None),
        "num_cpus": getattr(baseline, "num_cpus", None),
        "trials": trials,
        "best_trial": best.knobs.label() if best else None,
        "speedup": round(result.speedup, 3),
        "improved_over_baseline": improved,
        "diagnosis": result.diagnosis,
        "other_knobs": {
            "batch_size": knobs.batch_size or batch_size,
            "batch_size_tuned": knobs.batch_size is not None,
            "num_threads": knobs.num_threads,
            "compile": knobs.compile,
            "amp": knobs.amp,
            "non_blocking": knobs.non_blocking,
        },
    }
    ok = baseline is not None and not getattr(baseline, "error", None)
    out.update(
        {
            "ok": ok,
            "config": {
                "num_workers": knobs.num_workers,
                "pin_memory": knobs.pin_memory,
                # None means loadtune leaves torch's default (2 with workers, unset without).
                "prefetch_factor": knobs.prefetch_factor,
                "persistent_workers": knobs.persistent_workers if knobs.num_workers > 0 else None,
            },
            "tuning_wall_s": round(wall, 3),
            "how": how,
            "details": details,
        }
    )
    if not ok:
        out["reason"] = result.diagnosis


def run_dph(pipeline: Any, args: argparse.Namespace, out: dict[str, Any]) -> None:
    import torch
    from dataloader_param_helper import find_optimal_params
    from dataloader_param_helper.core import DataloaderParamHelper

    loader = pipeline.factory()
    dataset = loader.dataset
    batch_size = loader.batch_size
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    helper = DataloaderParamHelper.getInstance()
    deviation = ""
    if args.dph_max_workers is not None:  # NOT the documented use: a probe past the first failure
        helper._range.num_workers = (1, args.dph_max_workers)
        deviation = (
            f" DEVIATION from the documented use: searched num_workers range forced to "
            f"(1, {args.dph_max_workers}) instead of (1, os.cpu_count()={os.cpu_count()})."
        )
    how = (
        f"find_optimal_params(dataset=<pipeline dataset>, device=torch.device('{device.type}'), "
        f"batch_size={batch_size}), the package's exported function as its docstring describes "
        f"(and as the project's own tests call it); it ignores result_filepath/"
        f"load_result_file_if_exists/full_test and always uses ./dataloader_params.json "
        f"(cwd is a fresh temp dir) with the quick test.{deviation}"
    )
    out["how"] = how
    # Its search range, known before the call (kept if the call raises).
    out["details"] = {
        "os_cpu_count": os.cpu_count(),
        "num_workers_range": list(helper._range.num_workers),
        "device": device.type,
    }
    began = out["_call_began"] = time.perf_counter()
    params = find_optimal_params(dataset, device, batch_size)
    wall = time.perf_counter() - began

    errors = sorted(
        {r.error_msg for r in helper.test_result_dict.values() if getattr(r, "error_msg", "")}
    )
    measured = [r for r in helper.test_result_dict.values() if math.isfinite(r.avr_runtime_ms)]
    details = {
        **out["details"],
        "returned": {k: _finite(v) for k, v in params.items()},
        "tests_run": len(helper.test_result_dict),
        "tests_measured": len(measured),
        "test_errors": errors,
        "hardware": DataloaderParamHelper.HARDWARE_INFO_STR,
    }
    ok = math.isfinite(float(params.get("avr_runtime_ms", math.inf)))
    out.update(
        {
            "ok": ok,
            "config": {
                "num_workers": params.get("num_workers"),
                "pin_memory": bool(params["pin_memory"]) if "pin_memory" in params else None,
                "prefetch_factor": params.get("prefetch_factor"),
                "persistent_workers": (
                    bool(params["persistent_workers"]) if "persistent_workers" in params else None
                ),
            },
            "tuning_wall_s": round(wall, 3),
            "how": how,
            "details": details,
        }
    )
    if not ok:
        out["reason"] = (
            "returned a config with avr_runtime_ms=inf: no test configuration was measured "
            f"({len(helper.test_result_dict)} run); their errors: {errors or 'none recorded'}"
        )


RUNNERS = {"loadtune": run_loadtune, "dataloader-param-helper": run_dph}


# --- child: run the peer, write the result -----------------------------------------------------


def child_main(args: argparse.Namespace) -> int:
    peer = args.peer
    result: dict[str, Any] = {"ok": False, "config": None, "tuning_wall_s": None}
    try:
        pipeline = load_pipeline(args.pipeline)
        RUNNERS[peer](pipeline, args, result)
    except BaseException as exc:  # every failure of a peer is a result
        result["ok"] = False
        result["reason"] = f"{type(exc).__name__}: {exc}".strip()
        result["traceback"] = traceback.format_exc(limit=8)
        if result.get("tuning_wall_s") is None and "_call_began" in result:
            # time spent inside the peer's call before it raised
            result["tuning_wall_s"] = round(time.perf_counter() - result["_call_began"], 3)
    result.pop("_call_began", None)
    sys.stdout.flush()
    sys.stderr.flush()
    Path(args.child).write_text(json.dumps(result, default=str))
    return 0


# --- parent: start the child in its own session, enforce the limit, clean up -------------------


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def parent_main(args: argparse.Namespace) -> int:
    peer = args.peer
    try:
        version = importlib.metadata.version(PEERS[peer])
    except importlib.metadata.PackageNotFoundError:
        version = None
    record: dict[str, Any] = {
        "peer": peer,
        "version": version,
        "pipeline": args.pipeline,
        "ok": False,
        "config": None,
        "tuning_wall_s": None,
        "reason": None,
        "how": None,
    }
    with tempfile.TemporaryDirectory(prefix=f"peer-{peer}-") as work:
        result_path = Path(work) / "result.json"
        log_path = Path(work) / "peer.log"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(result_path)]
        cmd += _forwarded(args)
        env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        began = time.perf_counter()
        timed_out = False
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                cmd,
                cwd=work,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: workers included
            )
            try:
                proc.wait(timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            except BaseException:
                _kill_group(proc.pid)
                raise
            finally:
                _kill_group(proc.pid)  # whatever it left behind (DataLoader workers)
                proc.wait()
        total = time.perf_counter() - began
        log_text = log_path.read_text(errors="replace")
        if not args.quiet and log_text:
            sys.stderr.write(log_text if log_text.endswith("\n") else log_text + "\n")
        if timed_out:
            record["reason"] = f"timed out after {args.timeout_s} s (killed with its workers)"
            record["tuning_wall_s"] = round(total, 3)
        elif result_path.exists():
            child = json.loads(result_path.read_text())
            record.update(child)
        else:
            record["reason"] = f"peer process exited with code {proc.returncode} and no result"
        record["total_wall_s"] = round(total, 3)
        record["log_tail"] = log_text[-LOG_TAIL_CHARS:]
    if record["how"] is None:
        record["how"] = {
            "loadtune": f"tune(Workload(...), steps={args.lt_steps}, warmup={args.lt_warmup}, "
            f"max_trials={args.lt_max_trials}, auto_batch=True) per README 'Scenario C' "
            "(the peer process reported nothing; see reason)",
            "dataloader-param-helper": "find_optimal_params(dataset, device, batch_size) per its "
            "docstring (the peer process reported nothing; see reason)",
        }[peer]
    text = json.dumps(record, indent=2, default=str)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0 if record["ok"] else 1


def _forwarded(args: argparse.Namespace) -> list[str]:
    out = ["--peer", args.peer, "--pipeline", args.pipeline]
    out += ["--lt-steps", str(args.lt_steps), "--lt-warmup", str(args.lt_warmup)]
    out += ["--lt-max-trials", str(args.lt_max_trials)]
    if args.dph_max_workers is not None:
        out += ["--dph-max-workers", str(args.dph_max_workers)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", required=True, help=f"one of {', '.join(PEERS)} (or dph)")
    parser.add_argument("--pipeline", required=True, help="a name in benchmarks/pipelines.py")
    parser.add_argument("--json", help="write the result here too (it is always printed)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="wall-clock limit")
    parser.add_argument("--quiet", action="store_true", help="don't echo the peer's output")
    parser.add_argument(
        "--lt-steps", type=int, default=50, help="loadtune measured steps per trial (README: 50)"
    )
    parser.add_argument(
        "--lt-warmup", type=int, default=10, help="loadtune warmup steps per trial (default 10)"
    )
    parser.add_argument(
        "--lt-max-trials", type=int, default=6, help="loadtune trials per round (README: 6)"
    )
    parser.add_argument(
        "--dph-max-workers",
        type=int,
        default=None,
        help="NOT documented use: force dataloader-param-helper's num_workers range to "
        "(1, N), to probe past its failure on a 2-CPU machine",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.peer = ALIASES.get(args.peer, args.peer)
    if args.peer not in PEERS:
        parser.error(f"unknown peer {args.peer!r}; known: {', '.join(PEERS)}")
    if args.child:
        return child_main(args)
    return parent_main(args)


if __name__ == "__main__":
    sys.exit(main())
