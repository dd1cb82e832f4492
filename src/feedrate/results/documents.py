"""Reading a saved result back (``feedrate report``): which kind of result a JSON document
holds (tune, measure, doctor, transfer, or a ``feedrate run``), and what is missing from it when
it is not whole. A document written by feedrate reads back; one cut short or edited by hand is
refused with the field that is wrong."""

from __future__ import annotations

from typing import Any

from feedrate.results.doctor import DOCTOR_SCHEMA, Report
from feedrate.results.measurement import MEASURE_SCHEMA, Measurement
from feedrate.results.run import RUN_SCHEMA, RunReport
from feedrate.results.transfer import SCHEMA as TRANSFER_SCHEMA
from feedrate.results.transfer import TransferResult
from feedrate.results.tune import TUNE_SCHEMA, TuneResult

Result = TuneResult | Measurement | Report | TransferResult | RunReport

_NUMBER = (int, float)
#: The fields each kind of document cannot do without, and the JSON type each must have.
REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    TUNE_SCHEMA: {"baseline": dict, "best": dict, "trials": list, "findings": list},
    MEASURE_SCHEMA: {
        "config": dict,
        "samples_per_s": _NUMBER,
        "batches_per_s": _NUMBER,
        "spread": dict,
        "startup_s": _NUMBER,
        "window": dict,
        "warmup": dict,
        "processes": dict,
    },
    DOCTOR_SCHEMA: {"config": dict, "findings": list, "checks": list},
    TRANSFER_SCHEMA: {},
    RUN_SCHEMA: {
        "command": list,
        "exit_code": _NUMBER,
        "wall_s": _NUMBER,
        "processes": list,
        "loaders": list,
    },
}
#: Within a trial (tune's baseline, best and trials; the doctor's trials).
TRIAL_REQUIRED: dict[str, type | tuple[type, ...]] = {"config": dict, "reason": str}
_READERS: dict[str, Any] = {
    TUNE_SCHEMA: TuneResult.from_dict,
    MEASURE_SCHEMA: Measurement.from_dict,
    DOCTOR_SCHEMA: Report.from_dict,
    TRANSFER_SCHEMA: TransferResult.from_dict,
    RUN_SCHEMA: RunReport.from_dict,
}
_JSON_TYPE = {dict: "an object", list: "a list", str: "a string", _NUMBER: "a number"}


def _missing(doc: dict[str, Any], required: dict[str, Any], where: str) -> str | None:
    for name, kind in required.items():
        if name not in doc or doc[name] is None:
            return f"{where}{name} is missing"
        if not isinstance(doc[name], kind) or (isinstance(doc[name], bool) and kind is _NUMBER):
            return f"{where}{name} is not {_JSON_TYPE.get(kind, kind)}"
    return None


def problem(document: object) -> str | None:
    """What keeps ``document`` from being read as a feedrate result, or None."""
    if not isinstance(document, dict):
        return "it is not a JSON object"
    schema = document.get("schema")
    if schema not in REQUIRED:
        known = ", ".join(REQUIRED)
        return f"it is not a feedrate result (schema: {schema!r}; one of {known} was expected)"
    found = _missing(document, REQUIRED[schema], "")
    if found is not None:
        return f"a {schema} document, but {found}"
    trials = [("baseline", document.get("baseline")), ("best", document.get("best"))]
    trials += [(f"trials[{i}]", t) for i, t in enumerate(document.get("trials") or [])]
    for where, trial in trials:
        if trial is None and where not in ("baseline", "best"):
            continue
        if schema == TUNE_SCHEMA or where.startswith("trials"):
            if not isinstance(trial, dict):
                return f"a {schema} document, but {where} is not an object"
            found = _missing(trial, TRIAL_REQUIRED, f"{where}.")
            if found is not None:
                return f"a {schema} document, but {found}"
    return None


def read(document: object) -> Result:
    """The result ``document`` holds. Raises ``ValueError`` saying what is missing or wrong."""
    found = problem(document)
    if found is not None:
        raise ValueError(found)
    assert isinstance(document, dict)
    schema = document["schema"]
    try:
        result: Result = _READERS[schema](document)
    except KeyError as exc:
        raise ValueError(f"a {schema} document, but the field {exc} is missing") from exc
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"a {schema} document with a malformed field ({exc})") from exc
    return result
