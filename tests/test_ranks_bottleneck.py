"""What limits a pipeline tuned over several ranks of one node, from the figures the ranks
gathered (``search.ranks.slowest``): each rank decides within its share of the node's CPUs, so
the busy CPUs it is judged on are its share's, not its own load plus every other process on the
node. A QA run (``feedrate tune ddp_train.py:loader --nproc-per-node 2`` on 2 CPUs, a sample
sleeping 5 ms) called 40 waiting workers per rank CPU-bound, "0.6 of 1 CPUs busy"."""

from __future__ import annotations

import pytest

from feedrate.loader.config import LoaderConfig
from feedrate.results.measurement import Measurement
from feedrate.results.trial import Trial
from feedrate.search.advice import reason
from feedrate.search.bottleneck import bottleneck
from feedrate.search.ranks import job_busy, slowest
from feedrate.search.space import Space

from builders import measured

#: A rank's share of a 2-CPU node shared by 2 ranks.
SHARE = 1


def rank(
    rate: float, workers: int, main_cpu: float, each: float, queued: float, node_busy: float
) -> Measurement:
    """One rank's measurement: ``each`` worker's CPU and time ``queued`` for one (1.0 = a
    core), ``node_busy``: the busy CPUs the rank read on its node (all its ranks' included)."""
    return measured(
        rate, workers=workers, main_cpu=main_cpu, each=each, queued=queued, node_busy=node_busy
    )


def job(*ranks: Measurement) -> Trial:
    return Trial.of(slowest(list(ranks)), "test")


def why(best: Trial) -> str:
    space = Space(cpus=SHARE, baseline=LoaderConfig(1), max_workers=64)
    return reason(space, best, best, None, [best])


def waiting(node_busy: float) -> Trial:
    # The QA run's best trial on each rank: main process 22% of a core, 40 workers at 1% CPU
    # each and 7% queued for one (80 processes waking on 2 CPUs): 0.64 CPUs per rank.
    return job(
        rank(2868.0, 40, 0.22, 0.0105, 0.07, node_busy),
        rank(2900.0, 40, 0.22, 0.0105, 0.07, node_busy),
    )


def test_waiting_workers_on_two_ranks_are_not_cpu_bound() -> None:
    # The node 1.6 of 2 busy (80%): the 2 ranks' 1.28, others 0.32. Its others counted whole
    # against one rank's 1 CPU read the share 0.96 full; their half of it, 0.8, is not.
    best = waiting(node_busy=1.6)
    assert best.system_busy_cpus == pytest.approx(0.64 + 0.32 / 2)
    assert bottleneck(best, SHARE) == "latency"
    said = why(best)
    assert "CPU-bound" not in said and said.startswith("Workers spend most of their time waiting")


def test_waiting_workers_on_a_full_node_say_the_busy_cpus_they_were_judged_on() -> None:
    # The node measured full (1.95 of 2), the ranks' own loading most of it: more workers only
    # queue longer (the rule's intent). The reason quotes the figures that made it so, not
    # the pipeline's own 0.6 of 1 CPU as if that were full.
    best = waiting(node_busy=1.95)
    assert bottleneck(best, SHARE) == "cpu"
    said = why(best)
    assert "CPU-bound (1.0 of 1 CPUs busy, 0.6 with its own work" in said
    assert "queued for a CPU 7% of the time, ran 1%" in said


def test_workers_that_fill_their_share_of_the_node_are_still_cpu_bound() -> None:
    # Per-sample work: 2 workers per rank each 45% of a core and queued 30%, the node 1.95 of
    # 2 busy with the ranks' own 1.9.
    best = job(rank(900.0, 2, 0.05, 0.45, 0.3, 1.95), rank(910.0, 2, 0.05, 0.45, 0.3, 1.95))
    assert bottleneck(best, SHARE) == "cpu"
    assert why(best).startswith("The pipeline is CPU-bound (1.0 of 1 CPUs busy)")


def test_other_processes_are_split_between_the_ranks_of_the_node_they_ran_on() -> None:
    own = [0.6, 0.5, 0.9, 0.9]
    # One node: 3.3 busy, 2.9 of it the ranks' own; rank 1 bears its quarter of the other 0.4.
    assert job_busy([3.3, 3.3, None, 3.3], own, 1) == pytest.approx(0.5 + 0.4 / 4)
    # Two nodes of 2 ranks: rank 1's node read 1.5 busy, 1.1 its ranks' own; the other node's
    # ranks and busy CPUs are none of it.
    nodes = (0, 0, 1, 1)
    assert job_busy([1.5, None, 2.0, 2.0], own, 1, nodes) == pytest.approx(0.5 + 0.4 / 2)
    assert job_busy([None, None, 2.0, 2.0], own, 1, nodes) is None
