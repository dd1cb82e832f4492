"""Tests for feedrate.config: LoaderConfig as plain data, config_of, and rebuild keeping what a
loader yields while changing how it is produced."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
)

from feedrate.errors import UserError
from feedrate.loader.config import DEFAULT_PREFETCH_FACTOR, LoaderConfig
from feedrate.loader.init_args import recording
from feedrate.loader.rebuild import (
    allow_many_workers,
    config_of,
    is_iterable_style,
    loader_of,
    quiet_worker_count_warning,
    rebuild,
)

# --- doubles -----------------------------------------------------------------------------------


class Squares(Dataset[torch.Tensor]):
    """Item ``i`` is ``[i, i*i]``: batches show which indices they hold and in what order."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i * i])


class Counting(IterableDataset[int]):
    def __init__(self, n: int = 11) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))


class GrowingBatches(Sampler[list[int]]):
    """Batches of 1, 2, 3, ... indices, taken backwards: nothing DataLoader would make itself."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[list[int]]:
        order = list(range(self.n - 1, -1, -1))
        size = 1
        while order:
            yield order[:size]
            order = order[size:]
            size += 1

    def __len__(self) -> int:
        return sum(1 for _ in self)


def pairs_collate(items: list[torch.Tensor]) -> dict[str, Any]:
    return {"x": torch.stack(items), "n": len(items)}


def init_worker(worker_id: int) -> None:
    torch.manual_seed(worker_id)


class Scaled(DataLoader[Any]):
    """A subclass whose constructor does not take DataLoader's arguments."""

    def __init__(self, data: Any, scale: int) -> None:
        super().__init__(data, batch_size=4)
        self.scale = scale


class Tagged(DataLoader[Any]):
    """A subclass that keeps DataLoader's constructor."""


def batches_of(loader: DataLoader[Any]) -> list[Any]:
    """Every batch of one epoch (iterating to the end, so any workers exit)."""
    return list(loader)


def same_batches(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif isinstance(x, dict):
            if x.keys() != y.keys() or not same_batches(list(x.values()), list(y.values())):
                return False
        elif x != y:
            return False
    return True


# --- LoaderConfig ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (LoaderConfig(), LoaderConfig(0, False, None, False)),
        (LoaderConfig(0, True, 4, True), LoaderConfig(0, True, None, False)),
        (LoaderConfig(4), LoaderConfig(4, False, DEFAULT_PREFETCH_FACTOR, False)),
        (LoaderConfig(3, True, 5, True), LoaderConfig(3, True, 5, True)),
    ],
)
def test_normalized(config: LoaderConfig, expected: LoaderConfig) -> None:
    assert config.normalized() == expected
    assert config.normalized().normalized() == expected


@pytest.mark.parametrize(
    ("config", "depth"),
    [
        (LoaderConfig(0, prefetch_factor=8), 0),
        (LoaderConfig(4), 8),
        (LoaderConfig(3, False, 5), 15),
    ],
)
def test_queue_depth(config: LoaderConfig, depth: int) -> None:
    assert config.queue_depth == depth


def test_kwargs_leave_worker_only_settings_out_without_workers() -> None:
    assert LoaderConfig(0, True, 4, True).kwargs() == {"num_workers": 0, "pin_memory": True}
    assert LoaderConfig(2).kwargs() == {
        "num_workers": 2,
        "pin_memory": False,
        "prefetch_factor": 2,
        "persistent_workers": False,
    }
    assert LoaderConfig(6, True, 1, True).kwargs() == {
        "num_workers": 6,
        "pin_memory": True,
        "prefetch_factor": 1,
        "persistent_workers": True,
    }


@pytest.mark.parametrize(
    "config",
    [
        LoaderConfig(),
        LoaderConfig(0, True, 3, True),
        LoaderConfig(4),
        LoaderConfig(8, True, 4, True),
    ],
)
def test_dict_round_trip(config: LoaderConfig) -> None:
    data = config.to_dict()
    assert data == {
        "num_workers": config.normalized().num_workers,
        "pin_memory": config.normalized().pin_memory,
        "prefetch_factor": config.normalized().prefetch_factor,
        "persistent_workers": config.normalized().persistent_workers,
    }
    assert LoaderConfig.from_dict(json.loads(json.dumps(data))) == config.normalized()


def test_from_dict_defaults_and_ignores_unknown_keys() -> None:
    assert LoaderConfig.from_dict({}) == LoaderConfig()
    assert LoaderConfig.from_dict({"num_workers": 2, "extra": 1}) == LoaderConfig(2)


@pytest.mark.parametrize(
    ("config", "label"),
    [
        (LoaderConfig(), "w=0"),
        (LoaderConfig(0, True, 4, True), "w=0 pin"),
        (LoaderConfig(4), "w=4 pf=2"),
        (LoaderConfig(4, True, 3, True), "w=4 pf=3 persistent pin"),
    ],
)
def test_label(config: LoaderConfig, label: str) -> None:
    assert config.label() == label


def test_negative_workers_is_a_user_error_naming_the_value() -> None:
    with pytest.raises(UserError, match=r"num_workers.*-3"):
        LoaderConfig(num_workers=-3)


@pytest.mark.parametrize("prefetch", [0, -2])
def test_bad_prefetch_is_a_user_error_naming_the_value(prefetch: int) -> None:
    with pytest.raises(UserError, match=rf"prefetch_factor.*{prefetch}"):
        LoaderConfig(num_workers=2, prefetch_factor=prefetch)


def test_config_is_frozen_and_hashable() -> None:
    config = LoaderConfig(2)
    with pytest.raises(AttributeError):
        config.num_workers = 3  # type: ignore[misc]
    assert {config, LoaderConfig(2)} == {config}


# --- config_of ---------------------------------------------------------------------------------


def test_config_of_default_loader() -> None:
    assert config_of(DataLoader(Squares(), batch_size=4)) == LoaderConfig()


def test_config_of_worker_loader() -> None:
    loader = DataLoader(
        Squares(), batch_size=4, num_workers=2, pin_memory=True, prefetch_factor=5,
        persistent_workers=True,
    )  # fmt: skip
    assert config_of(loader) == LoaderConfig(2, True, 5, True)


def test_config_of_fills_torch_default_prefetch() -> None:
    assert config_of(DataLoader(Squares(), num_workers=2)) == LoaderConfig(2, False, 2, False)


# --- rebuild: what is kept ---------------------------------------------------------------------


def test_rebuild_keeps_dataset_batch_size_sampler_collate() -> None:
    ds = Squares()
    sampler = SequentialSampler(ds)
    loader = DataLoader(
        ds, batch_size=5, sampler=sampler, collate_fn=pairs_collate, worker_init_fn=init_worker,
        timeout=3.0, drop_last=True,
    )  # fmt: skip
    new = rebuild(loader, LoaderConfig(2, True, 3, True))
    assert new.dataset is ds
    assert new.batch_size == 5
    assert new.sampler is sampler
    assert new.collate_fn is pairs_collate
    assert new.worker_init_fn is init_worker
    assert new.timeout == 3.0
    assert new.drop_last is True
    assert config_of(new) == LoaderConfig(2, True, 3, True)


@pytest.mark.parametrize("drop_last", [False, True])
def test_rebuild_keeps_drop_last(drop_last: bool) -> None:
    loader = DataLoader(Squares(23), batch_size=5, drop_last=drop_last)
    new = rebuild(loader, LoaderConfig(0))
    assert new.drop_last is drop_last
    assert len(new) == len(loader) == (4 if drop_last else 5)
    assert same_batches(batches_of(new), batches_of(loader))


def test_rebuild_keeps_seeded_random_order() -> None:
    gen = torch.Generator().manual_seed(1234)
    loader = DataLoader(Squares(), batch_size=4, shuffle=True, generator=gen)
    new = rebuild(loader, LoaderConfig(0, pin_memory=False))
    assert new.generator is gen
    assert new.sampler is loader.sampler
    assert isinstance(new.sampler, RandomSampler)
    state = gen.get_state()
    original = batches_of(loader)
    gen.set_state(state)
    rebuilt = batches_of(new)
    assert same_batches(rebuilt, original)
    ordered = batches_of(DataLoader(Squares(), batch_size=4))
    assert not same_batches(original, ordered)  # the order really is shuffled


def test_rebuild_keeps_sampler_with_own_generator() -> None:
    ds = Squares()
    gen = torch.Generator().manual_seed(7)
    sampler = RandomSampler(ds, generator=gen)
    loader = DataLoader(ds, batch_size=3, sampler=sampler)
    new = rebuild(loader, LoaderConfig(0))
    assert new.sampler is sampler
    state = gen.get_state()
    original = batches_of(loader)
    gen.set_state(state)
    assert same_batches(batches_of(new), original)


def test_rebuild_keeps_custom_batch_sampler() -> None:
    ds = Squares(10)
    batch_sampler = GrowingBatches(len(ds))
    loader = DataLoader(ds, batch_sampler=batch_sampler, collate_fn=pairs_collate)
    new = rebuild(loader, LoaderConfig(0))
    assert new.batch_sampler is batch_sampler
    assert new.batch_size is None
    got = batches_of(new)
    assert [b["n"] for b in got] == [1, 2, 3, 4]
    assert same_batches(got, batches_of(loader))


def test_rebuild_keeps_torch_batch_sampler() -> None:
    ds = Squares(10)
    batch_sampler = BatchSampler(SequentialSampler(ds), batch_size=3, drop_last=True)
    loader = DataLoader(ds, batch_sampler=batch_sampler)
    new = rebuild(loader, LoaderConfig(0))
    assert new.batch_sampler is batch_sampler
    assert len(batches_of(new)) == 3


def test_rebuild_keeps_in_order_and_generator() -> None:
    gen = torch.Generator()
    loader = DataLoader(Squares(), batch_size=2, num_workers=2, in_order=False, generator=gen)
    new = rebuild(loader, LoaderConfig(4))
    assert new.in_order is False
    assert new.generator is gen


def test_rebuild_keeps_multiprocessing_context_with_workers() -> None:
    loader = DataLoader(Squares(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    new = rebuild(loader, LoaderConfig(3))
    assert new.multiprocessing_context is loader.multiprocessing_context
    assert new.multiprocessing_context is not None
    assert new.multiprocessing_context.get_start_method() == "spawn"


def test_rebuild_drops_multiprocessing_context_without_workers() -> None:
    ctx = multiprocessing.get_context("spawn")
    loader = DataLoader(
        Squares(), batch_size=2, num_workers=2, multiprocessing_context=ctx, timeout=5.0,
        prefetch_factor=4, persistent_workers=True,
    )  # fmt: skip
    new = rebuild(loader, LoaderConfig(0))  # DataLoader would refuse the context at 0 workers
    assert new.multiprocessing_context is None
    assert new.timeout == 5.0
    assert config_of(new) == LoaderConfig(0)
    assert new.prefetch_factor is None
    assert new.persistent_workers is False


# --- rebuild: what is applied ------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        LoaderConfig(0),
        LoaderConfig(0, True, 6, True),  # worker-only settings dropped, no DataLoader error
        LoaderConfig(1),
        LoaderConfig(5, True, 7, True),
    ],
)
def test_rebuild_applies_config(config: LoaderConfig) -> None:
    loader = DataLoader(Squares(), batch_size=4, num_workers=2, persistent_workers=True)
    new = rebuild(loader, config)
    norm = config.normalized()
    assert (new.num_workers, new.pin_memory) == (norm.num_workers, norm.pin_memory)
    assert new.prefetch_factor == norm.prefetch_factor
    assert new.persistent_workers is norm.persistent_workers
    assert config_of(new) == norm


def test_rebuild_replaces_dataset_on_request() -> None:
    loader = DataLoader(Squares(5), batch_size=2)
    other = Squares(5)
    new = rebuild(loader, LoaderConfig(0), dataset=other)
    assert new.dataset is other
    assert new.sampler is loader.sampler


def test_rebuild_leaves_the_original_alone() -> None:
    loader = DataLoader(Squares(), batch_size=4)
    rebuild(loader, LoaderConfig(3, True, 2, True))
    assert config_of(loader) == LoaderConfig()


# --- rebuild: other kinds of loader ------------------------------------------------------------


@pytest.mark.parametrize(("batch_size", "drop_last"), [(4, False), (4, True), (None, False)])
def test_rebuild_iterable_dataset(batch_size: int | None, drop_last: bool) -> None:
    ds = Counting(11)
    loader = DataLoader(ds, batch_size=batch_size, drop_last=drop_last)
    assert is_iterable_style(loader)
    new = rebuild(loader, LoaderConfig(2))
    assert is_iterable_style(new)
    assert new.dataset is ds
    assert (new.batch_size, new.drop_last) == (batch_size, drop_last)
    assert new.num_workers == 2
    same = rebuild(loader, LoaderConfig(0))
    assert same_batches(batches_of(same), batches_of(loader))


def test_rebuild_without_automatic_batching() -> None:
    ds = Squares(6)
    loader = DataLoader(ds, batch_size=None, sampler=[5, 1, 3])
    new = rebuild(loader, LoaderConfig(0))
    assert new.batch_size is None
    assert new.batch_sampler is None
    assert new.sampler is loader.sampler
    assert same_batches(batches_of(new), [ds[5], ds[1], ds[3]])


def test_rebuild_keeps_compatible_subclass() -> None:
    loader = Tagged(Squares(), batch_size=4)
    new = rebuild(loader, LoaderConfig(2))
    assert type(new) is Tagged
    assert new.num_workers == 2


class OnDevice(DataLoader[Any]):
    """A subclass with an argument of its own (kept as an attribute) and its own __iter__."""

    def __init__(self, dataset: Any, device: str, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.device = device

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            yield batch * 0 + 7  # what only this class yields


class Hidden(DataLoader[Any]):
    """A subclass whose own argument is not kept anywhere feedrate can see."""

    def __init__(self, dataset: Any, scale: int, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)


def test_rebuild_keeps_a_subclass_with_arguments_of_its_own() -> None:
    loader = OnDevice(Squares(8), "cuda:3", batch_size=4, shuffle=True)
    new = rebuild(loader, LoaderConfig(2))
    assert type(new) is OnDevice and new.device == "cuda:3" and new.num_workers == 2
    assert new.sampler is loader.sampler and new.batch_size == 4
    assert all(bool((b == 7).all()) for b in batches_of(new))  # its own __iter__ runs


def test_a_subclass_built_while_recording_is_rebuilt_from_its_arguments() -> None:
    with recording():
        loader = Hidden(Squares(8), 3, batch_size=2)
    new = rebuild(loader, LoaderConfig(0, pin_memory=False))
    assert type(new) is Hidden and new.batch_size == 2
    assert same_batches(batches_of(new), batches_of(loader))
    assert type(loader_of(lambda: Hidden(Squares(8), 3, batch_size=2))) is Hidden


def test_a_subclass_whose_arguments_are_unknown_is_refused_by_name() -> None:
    loader = Hidden(Squares(8), 3, batch_size=2)
    with pytest.raises(UserError, match=r"cannot rebuild Hidden.*'scale'"):
        rebuild(loader, LoaderConfig(0))


def test_a_subclass_that_ignores_the_settings_is_refused() -> None:
    # Scaled fixes its own batching and passes no num_workers on: rebuilt, it would not be
    # the configuration measured, so feedrate says so instead of measuring something else.
    ds = Squares(10)
    with recording():
        loader = Scaled(ds, scale=3)
    same = rebuild(loader, LoaderConfig(0, pin_memory=False))
    assert type(same) is Scaled and same.scale == 3 and same.dataset is ds
    other = Squares(6)
    assert rebuild(loader, LoaderConfig(0), dataset=other).dataset is other  # passed as `data`
    with pytest.raises(UserError, match=r"cannot rebuild Scaled.*num_workers=0 \(wanted 2\)"):
        rebuild(loader, LoaderConfig(2))


# --- rebuild: real workers, real warnings ------------------------------------------------------


def test_rebuilt_two_worker_loader_yields_the_same_batches() -> None:
    ds = Squares(41)
    order = [(7 * i) % 41 for i in range(41)]  # a fixed order that is not 0, 1, 2, ...
    loader = DataLoader(ds, batch_size=4, sampler=order, collate_fn=pairs_collate)
    new = rebuild(loader, LoaderConfig(2, prefetch_factor=2))
    assert new.num_workers == 2
    original = batches_of(loader)
    rebuilt = batches_of(new)  # exhausted: the workers shut down
    assert same_batches(rebuilt, original)
    assert [b["n"] for b in rebuilt] == [4] * 10 + [1]
    assert rebuilt[0]["x"][:, 0].tolist() == order[:4]


def test_rebuild_does_not_warn_about_many_workers(recwarn: pytest.WarningsRecorder) -> None:
    workers = max(16, 2 * (os.cpu_count() or 1))  # above the CPU count on any machine
    loader = DataLoader(Squares(), batch_size=4)
    new = rebuild(loader, LoaderConfig(workers))
    assert new.num_workers == workers
    assert not [w for w in recwarn if "worker processes in total" in str(w.message)]
    # The warning is really there to be silenced: DataLoader itself gives it.
    DataLoader(Squares(), batch_size=4, num_workers=workers)
    assert [w for w in recwarn if "worker processes in total" in str(w.message)]


# --- questionable behaviour, recorded ----------------------------------------------------------


def test_configs_with_the_same_settings_are_equal() -> None:
    a, b = LoaderConfig(4), LoaderConfig(4, prefetch_factor=2)
    assert a.kwargs() == b.kwargs()
    assert a == b


def test_allow_many_workers_drops_the_warning_on_that_loader_only() -> None:
    many = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1) + 2
    with quiet_worker_count_warning():
        mine, other = (DataLoader(list(range(8)), num_workers=many) for _ in range(2))
    assert allow_many_workers(mine) is mine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mine.check_worker_number_rationality()  # what DataLoader runs at every iter()
        other.check_worker_number_rationality()
    warned = [w for w in caught if "suggested max number of worker" in str(w.message)]
    assert len(warned) == 1  # the other loader's


class SlowIter(DataLoader[Any]):
    """A subclass whose own ``__iter__`` costs 20 ms a batch, and an argument of its own."""

    def __init__(self, dataset: Any, pause_s: float, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.pause_s = pause_s

    def __iter__(self) -> Any:
        for batch in super().__iter__():
            time.sleep(self.pause_s)
            yield batch


def test_measure_times_the_users_own_class_not_a_plain_dataloader() -> None:
    # Measured as a plain DataLoader this pipeline makes ~100k samples/s; its own __iter__
    # sleeps 20 ms per 4-sample batch, so no honest figure can exceed 200 samples/s.
    from feedrate.measuring.measure import measure

    m = measure(SlowIter(Squares(64), 0.02, batch_size=4), batches=8, windows_count=2)
    assert 0 < m.samples_per_s <= 4 / 0.02


# --- rebuild: subclasses that set DataLoader's arguments from their own ----------------------


class ByOwnNames(DataLoader[Any]):
    """Sets batch_size and num_workers from parameters named its own way; the rest it passes on
    through **kwargs."""

    def __init__(self, ds: Any, bs: int, *, workers: int = 0, **kw: Any) -> None:
        super().__init__(ds, batch_size=bs, num_workers=workers, **kw)


class FixedWorkers(DataLoader[Any]):
    """Passes most arguments on, but always builds without workers."""

    def __init__(self, ds: Any, bs: int, **kw: Any) -> None:
        super().__init__(ds, batch_size=bs, num_workers=0, **kw)


class TwoZeros(DataLoader[Any]):
    """Two parameters at 0: either could be the one that sets num_workers."""

    def __init__(self, ds: Any, *, workers: int = 0, seed: int = 0, **kw: Any) -> None:
        super().__init__(ds, num_workers=workers, **kw)
        self.seed = seed


class MakesItsOwn(DataLoader[Any]):
    """Builds its dataset inside __init__ (from a path, say) instead of taking one."""

    def __init__(self, path: str, bs: int, **kw: Any) -> None:
        self.path = path
        super().__init__(Squares(12), batch_size=bs, **kw)


def test_a_subclass_setting_arguments_from_its_own_is_rebuilt_with_workers() -> None:
    ds = Squares(41)
    order = [(7 * i) % 41 for i in range(41)]
    with recording():
        loader = ByOwnNames(ds, 4, sampler=order, collate_fn=pairs_collate)
    new = rebuild(loader, LoaderConfig(2, prefetch_factor=3))
    assert type(new) is ByOwnNames and new.num_workers == 2 and new.prefetch_factor == 3
    assert new.dataset is ds and new.batch_size == 4 and new.sampler is loader.sampler
    assert new.collate_fn is pairs_collate
    original = batches_of(loader)
    assert same_batches(batches_of(new), original)
    assert [b["n"] for b in original] == [4] * 10 + [1]


def test_a_subclass_setting_its_batch_size_takes_a_batch_sampler() -> None:
    # autotune feeds its own batch_sampler, which DataLoader refuses beside batch_size=4.
    ds = Squares(10)
    with recording():
        loader = ByOwnNames(ds, 4, shuffle=True)
    feed = GrowingBatches(10)
    new = rebuild(loader, LoaderConfig(0), batch_sampler=feed)
    assert type(new) is ByOwnNames and new.batch_sampler is feed
    expected = batches_of(DataLoader(ds, batch_sampler=feed))
    assert same_batches(batches_of(new), expected)


def test_a_subclass_that_fixes_a_setting_itself_is_refused_naming_its_parameters() -> None:
    with recording():
        loader = FixedWorkers(Squares(8), 4, shuffle=True)
    assert rebuild(loader, LoaderConfig(0, pin_memory=True)).pin_memory
    with pytest.raises(
        UserError,
        match=r"cannot rebuild FixedWorkers with num_workers=2: its __init__ sets "
        r"num_workers=0 itself.*\(ds, bs, \*\*kw\).*none holds it",
    ):
        rebuild(loader, LoaderConfig(2))


def test_a_subclass_whose_setting_could_come_from_two_parameters_is_refused() -> None:
    with recording():
        loader = TwoZeros(Squares(8), batch_size=4)
    with pytest.raises(UserError, match=r"cannot rebuild TwoZeros.*which of workers, seed"):
        rebuild(loader, LoaderConfig(2))


def test_a_subclass_that_builds_its_own_dataset_is_refused_saying_so() -> None:
    with recording():
        loader = MakesItsOwn("/data/x", 4, shuffle=True)
    with pytest.raises(
        UserError,
        match=r"cannot rebuild MakesItsOwn with other settings: its __init__ builds its "
        r"dataset itself \(a Squares\).*file\.py:make_loader",
    ):
        rebuild(loader, LoaderConfig(2))
