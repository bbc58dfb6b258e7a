"""An isolation checker for list-append histories, after Elle (Kingsbury and Alvaro, 2020).

A list-append history: each key holds a list, every transaction reads the lists of some
keys and appends a unique element to each. From the committed transactions, what each one
read, and the order every list ended in, the checker infers the dependencies between
transactions (Adya's):

* ``ww``: T1 appended the element just before T2's in a key's final order;
* ``wr``: T2 read a list whose last element T1 appended;
* ``rw``: T1 read a list, and T2 appended the element right after its last one (an
  anti-dependency: T1 did not see T2's write).

A cycle of ``ww`` edges only is G0 (dirty write); of ``ww`` and ``wr`` edges, G1c
(circular information flow); with at least one ``rw`` edge, G2 (anti-dependency cycle).
Serializability forbids all three. Besides cycles, it reports reads that are not a prefix
of the final order (``incompatible-order``), reads of elements no committed transaction
appended (``G1a``, aborted reads), and committed elements missing from the final state or
present twice (``lost``, ``duplicated``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence

from tests.support.graphs import strongly_connected


@dataclasses.dataclass(frozen=True)
class Txn:
    """One committed transaction: its name, the lists it read, the elements it appended."""

    name: str
    reads: Mapping[str, tuple[int, ...]]
    appends: Mapping[str, int]


@dataclasses.dataclass(frozen=True)
class Anomaly:
    kind: str  # G0, G1c, G2, G1a, incompatible-order, lost, duplicated
    txns: tuple[str, ...]
    detail: str


def check(
    committed: Sequence[Txn], final: Mapping[str, Sequence[int]], aborted: Iterable[int] = ()
) -> list[Anomaly]:
    """The anomalies of a history (module docstring); ``final``: each key's list at the end,
    ``aborted``: elements appended by transactions that did not commit."""
    out: list[Anomaly] = []
    writer = {(k, e): t.name for t in committed for k, e in t.appends.items()}
    aborted = set(aborted)
    for key, items in final.items():
        seen: set[int] = set()
        for e in items:
            if e in seen:
                out.append(Anomaly("duplicated", (writer.get((key, e), "?"),), f"{key}: {e} twice"))
            seen.add(e)
            if (key, e) not in writer:
                kind = "G1a" if e in aborted else "lost"
                out.append(Anomaly(kind, (), f"{key}: {e} in the final state, appended by no committed txn"))
    for (key, e), name in writer.items():
        if e not in final.get(key, ()):
            out.append(Anomaly("lost", (name,), f"{key}: committed {e} missing from the final state"))
    edges: dict[str, dict[str, set[str]]] = {t.name: {} for t in committed}

    def edge(a: str, b: str, kind: str) -> None:
        if a != b:
            edges[a].setdefault(b, set()).add(kind)

    for key, items in final.items():
        order = list(items)
        for before, after in itertools.pairwise(order):
            if (key, before) in writer and (key, after) in writer:
                edge(writer[(key, before)], writer[(key, after)], "ww")
    for t in committed:
        for key, read in t.reads.items():
            order = list(final.get(key, ()))
            if list(read) != order[: len(read)]:
                bad = [e for e in read if e in aborted]
                kind = "G1a" if bad else "incompatible-order"
                out.append(Anomaly(kind, (t.name,), f"{key}: read {list(read)}, final {order}"))
                continue
            if read and (key, read[-1]) in writer:
                edge(writer[(key, read[-1])], t.name, "wr")
            if len(read) < len(order) and (key, order[len(read)]) in writer:
                edge(t.name, writer[(key, order[len(read)])], "rw")
    out.extend(_cycles(edges))
    return out


def _cycles(edges: Mapping[str, Mapping[str, set[str]]]) -> list[Anomaly]:
    """One anomaly per strongly connected component with a cycle, classified by the weakest
    edge kinds a cycle in it needs: ww only (G0), ww+wr (G1c), else G2."""
    out = []
    for component in strongly_connected(edges):
        members = set(component)

        def has_cycle(kinds: set[str], members: set[str] = members) -> bool:
            sub = {a: {b for b, k in edges[a].items() if b in members and k & kinds} for a in members}
            return any(len(c) > 1 for c in strongly_connected(sub))

        kind = "G0" if has_cycle({"ww"}) else "G1c" if has_cycle({"ww", "wr"}) else "G2"
        out.append(Anomaly(kind, tuple(sorted(component)), f"a {kind} cycle among {len(component)} txns"))
    return out
