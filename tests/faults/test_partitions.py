"""Network partitions between writer processes, a 3-node ZooKeeper ensemble and an S3 server,
each on a host of its own (a network namespace of :mod:`tests.support.netns`): a writer cut
off while it holds a claim, the leader isolated in a minority, a symmetric split, a writer
cut off from S3 between claim and publish; each healed after a while.

The table's files are on the shared local file system (the S3 test: on the S3 server); only
ZooKeeper and S3 traffic crosses the virtual network. Every test ends with fresh handles:
the invariant check (gapless versions, every acknowledged commit exactly once, a commit of
unknown outcome at most once, contents equal to a replay), ``verify``, a new write; every
writer returned within a bound after the heal, and every error a writer saw is one of the
engine's typed errors.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eventlog import CommitStateUnknownError, SlotStoreError, StorageError
from eventlog.log.storage import LogStore
from tests.faults.netns_writers import (
    ZK_TIMEOUT,
    Fleet,
    Lab,
    Outcome,
    appender,
    create_table,
    cut_off_calls,
    final_checks,
    fixed_writer,
    victim,
)
from tests.support.invariants import WriterResult
from tests.support.netns import netns_available

pytestmark = [pytest.mark.zookeeper, pytest.mark.timeout(150)]

#: What a partition may make a commit raise: the slot store unreachable with nothing
#: committed, the outcome of a claim unknown, an object store unreachable.
PARTITION_ERRORS = (SlotStoreError, CommitStateUnknownError, StorageError)
#: A cut-off writer's ZooKeeper session is lost by then (session timeout, plus a margin).
SESSION_LOSS = ZK_TIMEOUT + 2
Options = dict[str, Any] | None  # s3fs storage options (None: the local file system)


@pytest.fixture(scope="module")
def lab_module() -> Iterator[Lab]:
    problem = netns_available()
    if problem is not None:
        pytest.fail(f"partition tests need network namespaces (they run as root): {problem}")
    lab = Lab()
    try:
        lab.start()
        yield lab
    finally:
        lab.close()


@pytest.fixture
def lab(lab_module: Lab) -> Lab:
    lab_module.heal_all()  # whatever an earlier test left
    return lab_module


@pytest.fixture
def fleet(lab_module: Lab) -> Iterator[Fleet]:
    fleet = Fleet(lab_module.net)
    try:
        yield fleet
    finally:
        fleet.close()


def _versions(uri: str) -> int:
    """How many commits the log of a local table holds (no slot store needed)."""
    return len(LogStore.commit_versions(LogStore(uri).list_log()))


def _wait_for(what: str, done: Callable[[], bool], timeout: float = 40.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.1)


def _progress(uri: str, commits: int, timeout: float = 40.0) -> None:
    """Wait until ``commits`` more commits are in the log of a local table."""
    target = _versions(uri) + commits
    _wait_for(f"{commits} more commits", lambda: _versions(uri) >= target, timeout)


def _assert_typed(outcome: Outcome) -> None:
    """Every error the writer saw is one of the engine's typed ones, its cause chained."""
    for error, trace in zip(outcome.errors, outcome.tracebacks, strict=True):
        assert isinstance(error, PARTITION_ERRORS), f"not one of the engine's typed errors:\n{trace}"
        if not isinstance(error, CommitStateUnknownError):  # the lockstore's or storage's error
            assert error.__cause__ is not None, trace


def _finish(fleet: Fleet, uri: str, spec: str, outcomes: list[Outcome], options: Options = None) -> None:
    """Every process exited and every error it saw is typed; the final checks, with fresh
    handles on host ``ctl``."""
    fleet.join(30)
    acks = [a for o in outcomes for a in o.acks]
    unknown = [u for o in outcomes for u in o.unknown]
    for outcome in outcomes:
        _assert_typed(outcome)
    report, latest, new_version = fleet.run("ctl", final_checks, uri, spec, options, acks, unknown)
    assert report.ok and report.problem is None, report
    assert report.versions_checked == latest + 1
    assert new_version == latest + 1


class Appenders:
    """:func:`appender` processes (worker -> host), started together once all opened the table."""

    def __init__(
        self,
        fleet: Fleet,
        uri: str,
        spec: str,
        hosts: dict[int, str],
        retry_seconds: float | dict[int, float],
        options: Options = None,
        *,
        group_commit: bool = False,
    ) -> None:
        start, self.stop = fleet.event(), fleet.event()
        ready = {w: fleet.event() for w in hosts}
        self.acked = {w: fleet.counter() for w in hosts}
        budget = retry_seconds if isinstance(retry_seconds, dict) else dict.fromkeys(hosts, retry_seconds)
        self.outs = {
            w: fleet.spawn(
                host, appender, uri, w, spec, options, budget[w], group_commit, ready[w], start, self.stop,
                self.acked[w],
            )
            for w, host in hosts.items()
        }  # fmt: skip
        for event in ready.values():
            assert event.wait(60), "a writer did not open the table"
        start.set()

    def acks(self, *workers: int) -> int:
        return sum(self.acked[w].value for w in workers or self.acked)

    def progress(self, commits: int, *workers: int, timeout: float = 40.0) -> None:
        """Wait until ``workers`` (default: all) acknowledged ``commits`` more commits."""
        target = self.acks(*workers) + commits
        _wait_for(
            f"{commits} more commits by {workers or 'all'}", lambda: self.acks(*workers) >= target, timeout
        )

    def results(self, timeout: float = 60.0) -> dict[int, Outcome]:
        """Stop them; each one's outcome (AssertionError if one does not stop in time)."""
        self.stop.set()
        return {w: Fleet.get(out, timeout) for w, out in self.outs.items()}


def _assert_decided(outcome: Outcome) -> None:
    """A commit whose claim was granted: the claim decided it, so it is acknowledged, or at
    worst reported unknown; never reported failed (the final checks find it exactly once)."""
    assert len(outcome.acks) + len(outcome.errors) == 1
    assert all(isinstance(e, CommitStateUnknownError) for e in outcome.errors), outcome.tracebacks


def _victim_steps(fleet: Fleet, count: int) -> tuple[Any, list[Any], list[tuple[Any, Any]]]:
    held = fleet.event()
    releases = [fleet.event() for _ in range(count)]
    steps = [(held, releases[0])] + [(None, r) for r in releases[1:]]
    return held, releases, steps


def test_writer_cut_off_from_zookeeper_while_holding_a_claim(lab: Lab, fleet: Fleet, tmp_path: Path) -> None:
    """The victim claims a version and is cut off before publishing it; the others go on
    (they publish its staged commit for it). Released while still cut off, its commit is
    acknowledged (the claim decided it) and in the log exactly once; its next commit, still
    cut off, fails with SlotStoreError without landing, and so does every other call of the
    table API that needs the slot store; after the heal it commits again."""
    spec, uri = lab.spec(), str(tmp_path / "t")
    assert fleet.run("ctl", create_table, uri, spec, None) == 0
    held, releases, steps = _victim_steps(fleet, 3)
    victim_out = fleet.spawn("wa", victim, uri, 7, spec, None, 3.0, "publish", steps)
    ready, go = fleet.event(), fleet.event()
    calls_out = fleet.spawn(
        "wa", cut_off_calls, uri, spec.replace(f"timeout={ZK_TIMEOUT:g}", "timeout=1"), None, ready, go
    )
    assert held.wait(60), "the victim never claimed"
    assert ready.wait(60), "the prober did not open the table"
    lab.net.cut("wa")
    go.set()
    rest = [fleet.spawn("wb", fixed_writer, uri, w, 12, spec, None) for w in (1, 2)]
    _progress(uri, 4)  # the majority side goes on past the victim's claim
    releases[0].set()
    first: Outcome = fleet.get(victim_out, 60)
    releases[1].set()
    cut_off: Outcome = fleet.get(victim_out, 60)
    calls, traces = fleet.get(calls_out, 60)
    assert fleet.exited(calls_out, 20) == 0  # a cut-off process shuts down (its store closes), bounded
    lab.net.heal("wa")
    releases[2].set()
    healed: Outcome = fleet.get(victim_out, 60)
    results: list[WriterResult] = [fleet.get(out, 90) for out in rest]

    _assert_decided(first)
    assert not cut_off.acks and len(cut_off.errors) == 1  # no commit without the majority
    assert isinstance(cut_off.errors[0], SlotStoreError)
    _assert_typed(cut_off)
    assert len(healed.acks) == 1 and not healed.errors
    assert all(not r.errors for r in results)  # the cut never reached them
    # Cut off, every call that needs the slot store raises the engine's SlotStoreError.
    assert set(traces) == set(calls), calls
    assert all(isinstance(calls[c], SlotStoreError) for c in calls), "\n".join(traces.values())
    _assert_typed(Outcome(0, errors=list(calls.values()), tracebacks=list(traces.values())))
    majority = [Outcome(r.worker, acks=r.acks) for r in results]
    _finish(fleet, uri, spec, [first, cut_off, healed, *majority])


def test_writer_cut_off_from_zookeeper_while_sending_its_claim(
    lab: Lab, fleet: Fleet, tmp_path: Path
) -> None:
    """The victim is cut off right before its claim goes out: the claim's outcome is
    unknown, its session expires while the others go on. Healed within its retry budget,
    it looks its transaction up, claims again, and its commit is acknowledged exactly once."""
    spec, uri = lab.spec(), str(tmp_path / "t")
    fleet.run("ctl", create_table, uri, spec, None)
    held, releases, steps = _victim_steps(fleet, 2)
    victim_out = fleet.spawn("wa", victim, uri, 7, spec, None, 60.0, "claim", steps)
    assert held.wait(60), "the victim never got to its claim"
    lab.net.cut("wa")
    releases[0].set()
    rest = [fleet.spawn("wb", fixed_writer, uri, w, 10, spec, None) for w in (1, 2)]
    _progress(uri, 4)
    time.sleep(SESSION_LOSS)  # the victim's session expires on the servers
    lab.net.heal("wa")
    first: Outcome = fleet.get(victim_out, 60)
    releases[1].set()
    second: Outcome = fleet.get(victim_out, 60)
    results: list[WriterResult] = [fleet.get(out, 90) for out in rest]

    assert len(first.acks) == 1 and not first.errors  # retried through the outage
    assert len(second.acks) == 1 and not second.errors
    assert all(not r.errors for r in results)
    majority = [Outcome(r.worker, acks=r.acks) for r in results]
    _finish(fleet, uri, spec, [first, second, *majority])


def test_leader_isolated_in_a_minority_then_healed(lab: Lab, fleet: Fleet, tmp_path: Path) -> None:
    """The leader's link goes down: the other two elect a leader and the writers go on
    through it; healed, the old leader rejoins as a follower."""
    spec, uri = lab.spec(), str(tmp_path / "t")
    fleet.run("ctl", create_table, uri, spec, None)
    writers = Appenders(fleet, uri, spec, {1: "wa", 2: "wb"}, 30.0, None)
    writers.progress(3)
    old = lab.zk.leader()
    lab.net.cut(lab.ZK_HOSTS[old])
    new = lab.zk.wait_for_leader(30, not_node=old)
    writers.progress(3, 1)  # through the new leader, both of them
    writers.progress(3, 2)
    lab.net.heal(lab.ZK_HOSTS[old])
    lab.wait_all_serving()
    assert lab.zk.modes()[old] == "follower" and lab.zk.leader() == new
    writers.progress(3)
    _finish(fleet, uri, spec, list(writers.results().values()))


@pytest.mark.parametrize("group_commit", [False, True], ids=["own-slots", "group-commit"])
def test_symmetric_split_only_the_majority_side_commits(
    lab: Lab, fleet: Fleet, tmp_path: Path, group_commit: bool
) -> None:
    """One follower and writer 1 (host ``wa``) on one side; the leader, the other follower
    and writers 2 and 3 (``wb``) on the other: only writers 2 and 3 commit while split;
    writer 1 waits or fails typed, and commits again once healed. With group commit, a
    leader on the majority side may carry writer 1's queued append (the files are shared):
    writer 1 then reports it unknown, and it is in the table once."""
    spec, uri = lab.spec(), str(tmp_path / "t")
    fleet.run("ctl", create_table, uri, spec, None)
    # A short retry budget for the minority writer (typed errors while split), a long one
    # for the others (never given up under contention).
    budgets = {1: 3.0, 2: 30.0, 3: 30.0}
    writers = Appenders(fleet, uri, spec, {1: "wa", 2: "wb", 3: "wb"}, budgets, group_commit=group_commit)
    writers.progress(3)
    follower = lab.ZK_HOSTS[(lab.zk.leader() + 1) % 3]
    lab.net.split([follower, "wa"])
    split_at = time.time()
    time.sleep(SESSION_LOSS)  # long enough for the minority's sessions to be lost
    writers.progress(4, 2, 3)
    lab.net.heal_split()
    healed_at = time.time()
    lab.wait_all_serving()
    writers.progress(3, 1)
    outcomes = writers.results()

    # A claim granted just before the split may still be published (storage is shared).
    assert not [a for a in outcomes[1].acks if split_at + 1 < a["at"] < healed_at], "the minority committed"
    during = [a for w in (2, 3) for a in outcomes[w].acks if split_at < a["at"] < healed_at]
    assert during, "the majority made no progress"
    _finish(fleet, uri, spec, list(outcomes.values()))


def test_writer_cut_off_from_s3_between_claim_and_publish(lab: Lab, fleet: Fleet) -> None:
    """Table on S3, slots in ZooKeeper. The victim reaches S3 over a link of its own, cut
    after its claim: its publish fails, yet its claim decided the version, so the commit is
    acknowledged (others publish the staged commit) and in the log exactly once. Its next
    commit, still cut off from S3, fails with StorageError; after the heal it commits again."""
    lab.start_s3()
    spec, uri, options = lab.spec(), f"s3://partitions-{uuid.uuid4().hex[:12]}/t", lab.s3_options()
    assert fleet.run("ctl", create_table, uri, spec, options) == 0
    held, releases, steps = _victim_steps(fleet, 3)
    victim_options = lab.s3_options(lab.wa_s3_address)
    victim_out = fleet.spawn("wa", victim, uri, 7, spec, victim_options, 3.0, "publish", steps)
    assert held.wait(60), "the victim never claimed"
    lab.net.cut_link("wa", "s3")
    releases[0].set()
    writers = Appenders(fleet, uri, spec, {1: "wb"}, 30.0, options)
    first: Outcome = fleet.get(victim_out, 90)
    writers.progress(3)
    releases[1].set()
    cut_off: Outcome = fleet.get(victim_out, 90)
    lab.net.heal_link("wa", "s3")
    releases[2].set()
    healed: Outcome = fleet.get(victim_out, 60)
    (others,) = writers.results().values()

    _assert_decided(first)
    assert not cut_off.acks and len(cut_off.errors) == 1
    assert isinstance(cut_off.errors[0], StorageError)  # S3 is out of reach, ZooKeeper is not
    _assert_typed(cut_off)
    assert len(healed.acks) == 1 and not healed.errors
    assert not others.errors
    _finish(fleet, uri, spec, [first, cut_off, healed, others], options)
