"""Bad input on the command line, as a new user would give it: one line naming the problem,
exit status 2, nothing measured first and nothing of the user's overwritten."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feedrate.cli import in_options, main
from feedrate.errors import UserError

from faults import fault, write_target

BODY = (
    "from torch.utils.data import DataLoader\nfrom faults import Squares\n"
    "loader = DataLoader(Squares(), batch_size=8)\n"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    code = done.value.code
    return (code if isinstance(code, int) else 1), captured.out, captured.err


@pytest.fixture
def target(tmp_path: Path) -> Path:
    return write_target(tmp_path, BODY)


@pytest.mark.parametrize(
    ("case", "make_args", "says"),
    [
        (
            fault("plot-into-missing-folder"),
            lambda t, d: ["--plot", str(d / "no" / "x.png")],
            "does not exist",
        ),
        (fault("plot-over-the-target"), lambda t, d: ["--plot", str(t)], "TARGET's own file"),
        (
            fault("html-over-a-python-file"),
            lambda t, d: ["--html", str(d / "other.py")],
            "existing Python file",
        ),
        (
            fault("two-outputs-one-file"),
            lambda t, d: ["--json", str(d / "a"), "--html", str(d / "a")],
            "same file",
        ),
        (fault("plot-to-stdout"), lambda t, d: ["--plot", "-"], "give it a name"),
        (fault("html-named-by-an-unset-variable"), lambda t, d: ["--html", ""], "is a folder"),
        (
            fault("json-under-a-file"),
            lambda t, d: ["--json", f"{t}/x.json"],
            "is a file, not a folder",
        ),
        (
            fault("json-into-proc"),  # os.access says yes to root there: the run failed at its end
            lambda t, d: ["--json", "/proc/feedrate.json"],
            "the folder /proc is not writable",
        ),
        (fault("rate-nan"), lambda t, d: ["--rate", "nan"], "'--rate': 'nan' is not a finite"),
        (
            fault("step-time-inf"),
            lambda t, d: ["--step-time", "inf"],
            "'--step-time': 'inf' is not a finite number above 0",
        ),
        (fault("budget-nan"), lambda t, d: ["--budget-s", "nan"], "'--budget-s': 'nan' is not"),
        (fault("budget-too-short"), lambda t, d: ["--budget-s", "1"], "--budget-s=1 is too short"),
        (
            fault("memory-limit-words"),
            lambda t, d: ["--memory-limit", "lots"],
            "--memory-limit 'lots' is not a size",
        ),
    ],
)
def test_tune_refuses_bad_input_before_measuring(
    capsys: pytest.CaptureFixture[str],
    target: Path,
    tmp_path: Path,
    case: str,
    make_args,
    says: str,
) -> None:
    (tmp_path / "other.py").write_text("print('mine')\n")
    before = target.read_bytes()
    code, out, err = run(capsys, "tune", f"{target}:loader", *make_args(target, tmp_path))
    assert code == 2, err
    assert says in err and "Traceback" not in err
    assert "samples/s ±" not in out + err  # refused before any trial ran
    assert (
        target.read_bytes() == before and (tmp_path / "other.py").read_text() == "print('mine')\n"
    )


@pytest.mark.parametrize(
    ("case", "args"),
    [
        (fault("prefetch-without-workers"), ["-w", "0", "--prefetch-factor", "4"]),
        (fault("persistent-without-workers"), ["-w", "0", "--persistent-workers"]),
        (fault("prefetch-on-a-loader-without-workers"), ["--prefetch-factor", "4"]),
    ],
)
def test_measure_refuses_settings_dataloader_would_ignore(
    capsys: pytest.CaptureFixture[str], target: Path, case: str, args: list[str]
) -> None:
    code, out, err = run(capsys, "measure", f"{target}:loader", *args)
    assert code == 2 and "need workers (-w 1 or more)" in err, err
    assert "samples/s" not in out


@pytest.mark.parametrize(
    ("case", "args", "says"),
    [
        (fault("measure-timeout-nan"), ["measure", "--timeout", "nan"], "'--timeout'"),
        (fault("measure-timeout-inf"), ["measure", "--timeout", "inf"], "'--timeout'"),
        (fault("measure-seconds-inf"), ["measure", "--seconds", "inf"], "'--seconds'"),
        (fault("measure-seconds-nan"), ["measure", "--seconds", "nan"], "'--seconds'"),
        (fault("doctor-trial-inf"), ["doctor", "--trial-seconds", "inf"], "'--trial-seconds'"),
        (fault("doctor-trial-nan"), ["doctor", "--trial-seconds", "nan"], "'--trial-seconds'"),
        (fault("doctor-timeout-nan"), ["doctor", "--timeout", "nan"], "'--timeout'"),
        (fault("tune-timeout-inf"), ["tune", "--timeout", "inf"], "'--timeout'"),
    ],
)
def test_seconds_that_are_not_finite_are_refused(
    capsys: pytest.CaptureFixture[str], target: Path, case: str, args: list[str], says: str
) -> None:
    # nan and inf pass a "> 0" range: they broke a timer (a traceback), never ended, or
    # measured nothing and said nothing. Refused as the command line is read.
    command, *rest = args
    code, out, err = run(capsys, command, f"{target}:loader", *rest)
    assert code == 2, err
    assert says in err and "is not a finite number above 0" in err and "Traceback" not in err
    assert "samples/s" not in out


@pytest.mark.parametrize("case", [fault("sizes-nan")])
def test_transfer_refuses_a_size_that_is_not_one(
    capsys: pytest.CaptureFixture[str], case: str
) -> None:
    code, _, err = run(capsys, "transfer", "--sizes", "64K,nan")
    assert code == 2 and "--sizes 'nan' is not a size" in err


def test_json_dash_writes_the_document_to_stdout_and_the_table_to_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "env", "--json", "-")
    assert code == 0
    assert json.loads(out)["schema"] == "feedrate.env/1"
    assert "usable CPUs" in err or "cpus" in err.lower()
    assert not (Path.cwd() / "-").exists()


@pytest.mark.parametrize(
    ("case", "document", "says"),
    [
        (fault("report-schema-only"), {"schema": "feedrate.tune/1"}, "baseline is missing"),
        (
            fault("report-null-trials"),
            {
                "schema": "feedrate.tune/1",
                "baseline": {"config": {}, "reason": "x"},
                "best": {"config": {}, "reason": "x"},
                "trials": None,
                "findings": [],
            },
            "trials is missing",
        ),
        (
            fault("report-bad-trial"),
            {
                "schema": "feedrate.tune/1",
                "baseline": {"config": {}, "reason": "x"},
                "best": {"config": {}, "reason": "x"},
                "trials": [3],
                "findings": [],
            },
            "trials[0] is not an object",
        ),
        (
            fault("report-measure-cut-short"),
            {"schema": "feedrate.measure/1", "config": {}},
            "samples_per_s is missing",
        ),
        (fault("report-not-an-object"), [1, 2], "not a JSON object"),
        (fault("report-unknown-schema"), {"schema": "x/1"}, "not a feedrate result"),
    ],
)
def test_report_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, document: object, says: str
) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    code, _, err = run(capsys, "report", str(path))
    assert code == 2, err
    assert says in err and "Traceback" not in err


def test_library_names_become_options_only_where_they_are_named() -> None:
    exc = UserError(
        "budget_s=1 is too short; rate and max_workers stay", params=("budget_s", "rate")
    )
    assert in_options(exc) == "--budget-s=1 is too short; --rate and max_workers stay"


def test_seconds_of_any_real_number_type_are_taken() -> None:
    import numpy as np

    from feedrate.units import check_seconds

    for ok in (2, 2.5, np.float32(2), np.int64(30)):
        check_seconds(ok, "seconds")  # numpy's scalars too, as before the finite check
    for bad in (True, 0, -1.0, float("nan"), float("inf"), "5"):
        with pytest.raises(UserError, match="seconds must be a positive, finite duration"):
            check_seconds(bad, "seconds")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args", [["--rate", "-5"], ["--budget-s", "0"], ["--step-time", "inf"]], ids=str
)
def test_a_bad_number_is_refused_before_the_target_is_imported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    # Importing a TARGET may build its dataset for minutes: a typo must not cost that first.
    marker = tmp_path / "imported"
    target = tmp_path / "slow.py"
    target.write_text(f"open({str(marker)!r}, 'w').close()\nloader = None\n")
    code, _, err = run(capsys, "tune", f"{target}:loader", *args)
    assert code == 2 and "is not a finite number above 0" in err, err
    assert not marker.exists()
