"""Finding checkpoints: their file names in a listing, and ``_last_checkpoint``.

PROTOCOL.md "Checkpoints" names three kinds: classic ``<v>.checkpoint.parquet``;
multi-part ``<v>.checkpoint.<o:010d>.<p:010d>.parquet`` (parts 1..p, a set with a part
missing is ignored); UUID-named V2 ``<v>.checkpoint.<uuid>.{json,parquet}``.
``_last_checkpoint`` names one of them (``parts`` for a multi-part set, ``v2Checkpoint``
for a UUID-named one), so its files can be opened without listing the log directory.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import orjson

from eventlog.log.checkpoint_state import LAST_CHECKPOINT
from eventlog.log.storage import whole_file_options

__all__ = [
    "CHAIN_HEAD_KEY",
    "CheckpointFiles",
    "LastCheckpoint",
    "find_latest_checkpoint",
    "is_local",
    "list_checkpoints",
    "list_log",
    "read_last_checkpoint",
    "read_last_checkpoint_info",
]

CHAIN_HEAD_KEY = b"eventlog.chainHead"

_CLASSIC_RE = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_MULTIPART_RE = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_UUID_RE = re.compile(
    r"^(\d{20})\.checkpoint\.([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"
    r"\.(json|parquet)$"
)
_KIND_ORDER = {"classic": 0, "v2": 1, "multipart": 2}  # preference at one version

# --------------------------------------------------------------------------- locate


@dataclass(frozen=True, slots=True)
class CheckpointFiles:
    """One complete checkpoint: its version, kind and file names in the log directory
    (``kind`` is ``"classic"``, ``"multipart"`` (parts in order) or ``"v2"``)."""

    version: int
    kind: str
    names: tuple[str, ...]


def _name(entry: str) -> str:
    return entry.rstrip("/").rpartition("/")[2]


def list_checkpoints(listing: Iterable[str]) -> list[CheckpointFiles]:
    """Every complete checkpoint in a log directory listing (names or paths), newest first;
    at one version a classic checkpoint comes first, then UUID-named V2 ones, then
    multi-part sets. Multi-part sets with a part missing are left out."""
    found: list[CheckpointFiles] = []
    parts: dict[tuple[int, int], dict[int, str]] = {}
    for entry in listing:
        if ".checkpoint." not in entry:  # a cheap filter before the regexes
            continue
        name = _name(entry)
        if m := _CLASSIC_RE.match(name):
            found.append(CheckpointFiles(int(m.group(1)), "classic", (name,)))
        elif m := _UUID_RE.match(name):
            found.append(CheckpointFiles(int(m.group(1)), "v2", (name,)))
        elif m := _MULTIPART_RE.match(name):
            part, of = int(m.group(2)), int(m.group(3))
            if 1 <= part <= of:
                parts.setdefault((int(m.group(1)), of), {})[part] = name
    for (version, of), names in parts.items():
        if len(names) == of:
            found.append(CheckpointFiles(version, "multipart", tuple(names[i] for i in range(1, of + 1))))
    found.sort(key=lambda c: (-c.version, _KIND_ORDER[c.kind], c.names))
    return found


def list_log(fs: fsspec.AbstractFileSystem, log_dir: str) -> list[str]:
    return [str(p) for p in fs.ls(log_dir, detail=False)]


def find_latest_checkpoint(
    fs: fsspec.AbstractFileSystem,
    log_dir: str,
    at_or_before: int | None = None,
    listing: Sequence[str] | None = None,
) -> int | None:
    """Version of the newest complete checkpoint of any kind ``<= at_or_before`` (any if
    None). ``listing`` is the log directory's file names (or paths); without it,
    ``log_dir`` is listed. Read it with :func:`read_checkpoint` (pass the same listing)."""
    if listing is None:
        try:
            listing = list_log(fs, log_dir)
        except FileNotFoundError:
            return None
    for cp in list_checkpoints(listing):
        if at_or_before is None or cp.version <= at_or_before:
            return cp.version
    return None


@dataclass(frozen=True, slots=True)
class LastCheckpoint:
    """The fields of ``_delta_log/_last_checkpoint`` (PROTOCOL.md "Last Checkpoint File";
    ``v2_checkpoint`` is the file name of a UUID-named V2 checkpoint, as Delta Spark
    records it under ``v2Checkpoint.path``)."""

    version: int
    size: int | None = None
    parts: int | None = None
    size_in_bytes: int | None = None
    num_of_add_files: int | None = None
    v2_checkpoint: str | None = None

    def files(self) -> CheckpointFiles:
        """The files of the checkpoint this pointer names: openable without listing."""
        v = f"{self.version:020d}"
        if self.v2_checkpoint is not None:
            return CheckpointFiles(self.version, "v2", (self.v2_checkpoint,))
        if self.parts is not None:
            names = tuple(
                f"{v}.checkpoint.{i:010d}.{self.parts:010d}.parquet" for i in range(1, self.parts + 1)
            )
            return CheckpointFiles(self.version, "multipart", names)
        return CheckpointFiles(self.version, "classic", (f"{v}.checkpoint.parquet",))


def _opt_int(d: dict[str, Any], key: str, minimum: int) -> int | None:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        return None
    return value


def read_last_checkpoint_info(fs: fsspec.AbstractFileSystem, log_dir: str) -> LastCheckpoint | None:
    """The parsed ``_last_checkpoint``; None if it is absent or unreadable.

    A torn or corrupt pointer is only an optimisation lost: callers fall back to listing.
    Optional fields of the wrong type are dropped; a ``v2Checkpoint`` whose path is not a
    UUID-named checkpoint of that version is ignored.
    """
    try:
        d = orjson.loads(fs.cat_file(f"{log_dir.rstrip('/')}/{LAST_CHECKPOINT}", **whole_file_options(fs)))
    except (OSError, ValueError):
        return None
    if not isinstance(d, dict):
        return None
    version = _opt_int(d, "version", 0)
    if version is None:
        return None
    v2: str | None = None
    v2_info = d.get("v2Checkpoint")
    if isinstance(v2_info, dict) and isinstance(v2_info.get("path"), str):
        name = _name(v2_info["path"])
        m = _UUID_RE.match(name)
        v2 = name if m is not None and int(m.group(1)) == version else None
    return LastCheckpoint(
        version=version,
        size=_opt_int(d, "size", -1),
        parts=_opt_int(d, "parts", 1),
        size_in_bytes=_opt_int(d, "sizeInBytes", 0),
        num_of_add_files=_opt_int(d, "numOfAddFiles", 0),
        v2_checkpoint=v2,
    )


def read_last_checkpoint(fs: fsspec.AbstractFileSystem, log_dir: str) -> int | None:
    """Version named by ``_last_checkpoint``; None if it is absent or unreadable."""
    info = read_last_checkpoint_info(fs, log_dir)
    return None if info is None else info.version


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))
