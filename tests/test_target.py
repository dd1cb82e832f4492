"""Tests for feedrate.target: parsing TARGET specs and loading the user's DataLoader."""

from __future__ import annotations

import importlib
import multiprocessing.resource_tracker
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from feedrate.errors import TargetError, UserError
from feedrate.loader.target import TargetSpec, load_step, load_target, parse_target

LOADER_HEADER = "from torch.utils.data import DataLoader\n"


@pytest.fixture(scope="module", autouse=True)
def resource_tracker() -> None:
    """Start multiprocessing's resource tracker before ``no_leaks`` looks at child processes.

    The first spawn starts it and it lives as long as this process: a singleton, not a leak.
    (Module scope makes it run before the function-scoped ``no_leaks`` takes its snapshot.)
    """
    multiprocessing.resource_tracker.ensure_running()


@pytest.fixture(autouse=True)
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what load_target adds to sys.path and sys.modules, so tests do not see each other."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def write(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    importlib.invalidate_caches()
    return path


def load_error(spec: str | TargetSpec) -> TargetError:
    with pytest.raises(TargetError) as info:
        load_target(spec)
    message = str(info.value)
    assert "\n" not in message, message
    return info.value


# --- parse_target ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("train.py:loader", TargetSpec("file", "train.py", "loader")),
        ("src/data/train.py:loader", TargetSpec("file", "src/data/train.py", "loader")),
        ("data/make_loader:loader", TargetSpec("file", "data/make_loader", "loader")),
        ("pkg.data:train_loader", TargetSpec("module", "pkg.data", "train_loader")),
        ("pkg:cfg.loader", TargetSpec("module", "pkg", "cfg.loader")),
        ("a:b:c.py:x", TargetSpec("file", "a:b:c.py", "x")),
    ],
)
def test_parse_target_forms(spec: str, expected: TargetSpec) -> None:
    assert parse_target(spec) == expected
    assert str(parse_target(spec)) == spec


@pytest.mark.parametrize(
    "spec",
    ["train.py", "train.py:", ":loader", "train.py:not-a-name", "train.py:1st", "my-mod:loader"],
)
def test_parse_target_rejects_bad_forms(spec: str) -> None:
    with pytest.raises(
        TargetError, match=r"expected path/to/file\.py:NAME or package\.module:NAME"
    ):
        parse_target(spec)


def test_target_error_is_a_user_error() -> None:
    with pytest.raises(UserError) as info:
        load_target("nonsense")
    assert info.value.exit_code == 2


# --- loading what works ---------------------------------------------------------------------


def test_file_with_a_loader(tmp_path: Path) -> None:
    path = write(
        tmp_path, "train.py", LOADER_HEADER + "loader = DataLoader(range(8), batch_size=4)\n"
    )
    loader = load_target(f"{path}:loader")
    assert isinstance(loader, DataLoader)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_file_with_a_factory_function(tmp_path: Path) -> None:
    body = LOADER_HEADER + "def make(batch_size=2):\n    return DataLoader(range(4), batch_size)\n"
    path = write(tmp_path, "factory.py", body)
    assert load_target(f"{path}:make").batch_size == 2


def test_dataloader_subclass_and_attribute_path(tmp_path: Path) -> None:
    body = """
    from torch.utils.data import DataLoader

    class MyLoader(DataLoader):
        pass

    class Config:
        loader = MyLoader(range(4), batch_size=2)
    """
    path = write(tmp_path, "cfg.py", body)
    assert type(load_target(f"{path}:Config.loader")).__name__ == "MyLoader"


def test_package_module_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "mypkg/__init__.py", "")
    write(
        tmp_path, "mypkg/data.py", LOADER_HEADER + "loader = DataLoader(range(6), batch_size=3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_target("mypkg.data:loader").batch_size == 3


def test_sibling_imports_work_and_module_is_registered(tmp_path: Path) -> None:
    write(tmp_path, "helpers.py", "SIZE = 5\n")
    path = write(
        tmp_path,
        "sib.py",
        LOADER_HEADER + "import helpers\nloader = DataLoader(range(10), batch_size=helpers.SIZE)\n",
    )
    loader = load_target(f"{path}:loader")
    assert loader.batch_size == 5
    assert sys.modules["sib"].loader is loader
    assert sys.path[0] == str(tmp_path)


def test_same_file_is_imported_once(tmp_path: Path) -> None:
    path = write(tmp_path, "once.py", LOADER_HEADER + "loader = DataLoader(range(4))\n")
    assert load_target(f"{path}:loader") is load_target(f"{path}:loader")


def test_stem_taken_by_another_module_gets_a_unique_name(tmp_path: Path) -> None:
    import json

    path = write(tmp_path, "json.py", LOADER_HEADER + "loader = DataLoader(range(4))\n")
    loader = load_target(f"{path}:loader")
    assert sys.modules["json"] is json
    assert any(n.startswith("_feedrate_target_json_") for n in sys.modules)
    assert isinstance(loader, DataLoader)


def test_spawn_workers_can_unpickle_a_dataset_class_defined_in_the_file(tmp_path: Path) -> None:
    body = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.tensor(i * i)

    loader = DataLoader(
        Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn"
    )
    """
    path = write(tmp_path, "spawned.py", body)
    batches = list(load_target(f"{path}:loader"))  # exhausting it lets the workers exit
    assert [b.tolist() for b in batches] == [[0, 1], [4, 9]]
    assert all(isinstance(b, torch.Tensor) for b in batches)


# --- what the user is told when it does not work -------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "x.py"
    assert str(load_error(f"{missing}:loader")) == f"no such file: {missing}"


def test_a_file_that_joins_the_process_group_again_is_told_to_guard_it(tmp_path: Path) -> None:
    # The usual DDP script calls init_process_group at import; under torchrun feedrate joined
    # the group before importing it, and torch's own error does not say so.
    write(
        tmp_path,
        "ddp_job.py",
        """
        raise ValueError("trying to initialize the default process group twice!")
        """,
    )
    message = str(load_error(f"{tmp_path / 'ddp_job.py'}:loader"))
    assert "feedrate joined the job's process group before importing it" in message
    assert "if not torch.distributed.is_initialized()" in message


def test_missing_module() -> None:
    error = load_error("no_such_pkg_zz.data:loader")
    assert str(error) == "no module named 'no_such_pkg_zz.data'"


def test_missing_module_hints_at_a_file_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "trainer_zz.py", "")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    assert "use trainer_zz.py:NAME" in str(load_error("trainer_zz:loader"))


def test_missing_name_suggests_a_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, "named.py", LOADER_HEADER + "loader = DataLoader(range(4))\n")
    assert (
        str(load_error(f"{path}:loadr")) == f"{path} has no name 'loadr' (did you mean 'loader'?)"
    )


def test_missing_name_without_a_close_one_lists_the_loaders(tmp_path: Path) -> None:
    body = LOADER_HEADER + "train_dl = DataLoader(range(4))\nval_dl = DataLoader(range(2))\n"
    path = write(tmp_path, "two.py", body)
    assert str(load_error(f"{path}:zzz")).endswith("(DataLoaders it defines: train_dl, val_dl)")


def test_missing_name_lists_the_functions_that_may_build_one(tmp_path: Path) -> None:
    body = (
        LOADER_HEADER
        + "from os.path import join\n"  # imported: not this file's
        + "def make_loader(shuffle=False):\n    return DataLoader(range(4))\n"
        + "def collate(batch):\n    return batch\n"  # takes an argument: no loader maker
    )
    path = write(tmp_path, "maker.py", body)
    message = str(load_error(f"{path}:zzz"))
    assert message.endswith("(functions it defines that take no arguments: make_loader)"), message
    # A step takes the batch: the functions offered are those that take one argument.
    with pytest.raises(TargetError) as err:
        load_step(f"{path}:step")
    assert str(err.value).endswith("(functions it defines that take one argument: collate)")


def test_missing_attribute_in_a_dotted_name(tmp_path: Path) -> None:
    path = write(tmp_path, "obj.py", "class Cfg:\n    loader = None\n")
    message = str(load_error(f"{path}:Cfg.lodaer"))
    assert message == f"{path}:Cfg has no attribute 'lodaer' (did you mean 'loader'?)"


def test_wrong_type(tmp_path: Path) -> None:
    path = write(tmp_path, "rows.py", "rows = [1, 2, 3]\n")
    assert str(load_error(f"{path}:rows")) == (
        f"{path}:rows is a list, not a torch.utils.data.DataLoader"
        " or a zero-argument callable returning one"
    )


def test_a_dataset_is_told_to_wrap_it(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "ds.py",
        "from torch.utils.data import TensorDataset\nimport torch\n"
        "ds = TensorDataset(torch.zeros(4))\n",
    )
    assert str(load_error(f"{path}:ds")).endswith("wrap the Dataset in a DataLoader")


def test_callable_needing_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, "args.py", "def make(root, *, batch_size, shuffle=False):\n    pass\n")
    message = str(load_error(f"{path}:make"))
    assert message.startswith(
        f"{path}:make needs arguments (root, batch_size), but make must take none"
    )


def test_callable_returning_wrong_type(tmp_path: Path) -> None:
    path = write(
        tmp_path, "ret.py", "def make():\n    return {'a': 1}\n\ndef forgot():\n    pass\n"
    )
    assert str(load_error(f"{path}:make")) == f"{path}:make returned a dict, not a DataLoader"
    assert "return loader" in str(load_error(f"{path}:forgot"))


def test_user_exception_at_import(tmp_path: Path) -> None:
    write(tmp_path, "helper.py", "def f():\n    return 1 / 0\n")
    path = write(tmp_path, "bad.py", "import helper\n\nhelper.f()\n")
    error = load_error(f"{path}:loader")
    message = str(error)
    assert message == (
        f"{path}:loader: importing it raised ZeroDivisionError: division by zero"
        f" (at {path}:3 in <module>; {tmp_path / 'helper.py'}:2 in f)"
    )
    assert "importlib" not in message
    assert isinstance(error.__cause__, ZeroDivisionError)
    assert "bad" not in sys.modules  # a failed import is not left half-registered


def test_user_frames_under_the_working_directory_are_relative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "rel.py", "x = 1\nraise ValueError('first line\\nsecond line')\n")
    monkeypatch.chdir(tmp_path)
    assert str(load_error("rel.py:loader")) == (
        "rel.py:loader: importing it raised ValueError: first line ... (at rel.py:2 in <module>)"
    )


def test_long_messages_are_clipped(tmp_path: Path) -> None:
    path = write(tmp_path, "long.py", "raise RuntimeError('x' * 1000)\n")
    assert len(str(load_error(f"{path}:loader"))) < 400


def test_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "syn.py", "x = 1\ny = (\n")
    message = str(load_error(f"{path}:loader"))
    assert "importing it raised SyntaxError" in message
    assert f"{path}:2" in message


def test_user_exception_inside_the_callable(tmp_path: Path) -> None:
    path = write(tmp_path, "call.py", "def make():\n    raise KeyError('root')\n")
    error = load_error(f"{path}:make")
    assert str(error) == (f"{path}:make: calling it raised KeyError: 'root' (at {path}:2 in make)")
    assert isinstance(error.__cause__, KeyError)


def test_other_missing_module_inside_user_code_is_the_users_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path, "userpkg/__init__.py", "")
    write(tmp_path, "userpkg/data.py", "import not_installed_dep_zz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = str(load_error("userpkg.data:loader"))
    assert message.startswith(
        "userpkg.data:loader: importing it raised ModuleNotFoundError:"
        " No module named 'not_installed_dep_zz' (at "
    )
    assert "data.py:1 in <module>" in message


def test_sys_exit_at_import(tmp_path: Path) -> None:
    body = "import argparse\nargparse.ArgumentParser().parse_args(['--nope'])\n"
    path = write(tmp_path, "cli.py", body)
    error = load_error(f"{path}:loader")
    message = str(error)
    assert message.startswith(f"{path}:loader: importing it called sys.exit(2)")
    assert f"{path}:2 in <module>" in message
    assert 'if __name__ == "__main__"' in message
    assert "give the script its own arguments (args)" in message  # the CLI: after --
    assert error.params == ("args",)
    assert isinstance(error.__cause__, SystemExit)


def test_sys_exit_at_import_with_arguments_names_them(tmp_path: Path) -> None:
    path = write(tmp_path, "cli2.py", "import argparse\nargparse.ArgumentParser().parse_args()\n")
    message = str(load_error(parse_target(f"{path}:loader", ("--bogus", "a b"))))
    assert message.endswith("with the arguments it was given (args: --bogus 'a b')"), message


ARGS_SCRIPT = """
    import argparse, sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=8)
    SEEN_AT_IMPORT = list(sys.argv)

    def build():
        args = parser.parse_args()  # read again where the loader is built, as scripts do
        return DataLoader(TensorDataset(torch.zeros(64, 2)), batch_size=args.batch_size)

    loader = build()
"""


def test_a_script_sees_its_own_arguments_while_it_builds_the_loader(tmp_path: Path) -> None:
    from feedrate.loader.target import load_source

    path = write(tmp_path, "withargs.py", ARGS_SCRIPT)
    argv = list(sys.argv)
    loader = load_target(parse_target(f"{path}:loader", ("--batch-size", "16")))
    assert loader.batch_size == 16
    seen = sys.modules["withargs"].SEEN_AT_IMPORT
    assert seen == [str(path), "--batch-size", "16"]
    assert sys.argv == argv  # feedrate's own, back
    # NAME a function: each loader built later sees them too, and sys.argv is back after
    factory = load_source(parse_target(f"{path}:build", ("--batch-size", "4")))
    assert callable(factory)
    assert factory().batch_size == 4 and factory().batch_size == 4
    assert sys.argv == argv


def test_without_arguments_a_script_sees_none_of_feedrates(tmp_path: Path) -> None:
    path = write(tmp_path, "noargs.py", ARGS_SCRIPT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["feedrate", "tune", f"{path}:loader", "--budget", "30"])
        assert load_target(f"{path}:loader").batch_size == 8  # its default: no --budget error


def test_keyboard_interrupt_propagates(tmp_path: Path) -> None:
    path = write(tmp_path, "kbd.py", "raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        load_target(f"{path}:loader")
