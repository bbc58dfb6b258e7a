"""Tamper evidence: every commit carries the hash of the one before it and its own.

A commit's ``commitInfo`` ends with an ``eventlog.audit`` field (Delta readers ignore
unknown commitInfo fields)::

    "eventlog.audit":{"prev":"<sha256 of version N-1's file bytes>","hash":"<sha256>"}
    "eventlog.audit":{"prev":null,"hash":"<sha256>","hmac":"<hmac-sha256>"}   (version 0, keyed)

``hash`` is the SHA-256 of the commit file's bytes with the ``hash`` (and ``hmac``) value
replaced by 64 zeros; ``hmac`` is HMAC-SHA256 of the same bytes under the audit key
(:data:`AUDIT_KEY_ENV`), for users who keep storage and the slot store under one
administrator. Both are fixed-width hex, so the placeholder substitution is exact and
verification never depends on re-encoding JSON.

:func:`chain_commit` writes a commit's bytes for the version it is about to claim (the
previous commit's hash is part of them, so a writer that loses the race re-stages).
:func:`verify_chain` walks the log and names the first version that was edited, removed,
inserted or reordered; see :mod:`eventlog.snapshot.audit` for the full check with slot
anchors and checkpoints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac as hmac_lib
import os
import re
from collections.abc import Sequence

from eventlog.log.actions import Action, CommitInfo, encode_commit

__all__ = [
    "AUDIT_FIELD",
    "AUDIT_KEY_ENV",
    "AuditFields",
    "anchor",
    "audit_key_from_env",
    "chain_commit",
    "digest",
    "read_audit",
    "recompute",
]

AUDIT_FIELD = "eventlog.audit"
AUDIT_KEY_ENV = "EVENTLOG_AUDIT_KEY"
_ZERO = "0" * 64
_PATTERN = re.compile(
    rb'"eventlog\.audit":\{"prev":(null|"[0-9a-f]{64}"),"hash":"([0-9a-f]{64})"(?:,"hmac":"([0-9a-f]{64})")?\}'
)


def audit_key_from_env() -> bytes | None:
    """The audit key from ``EVENTLOG_AUDIT_KEY`` (UTF-8), or None."""
    value = os.environ.get(AUDIT_KEY_ENV)
    return value.encode() if value else None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def anchor(data: bytes) -> str | None:
    """What a slot claim records for a chained commit: its content hash (None: unchained)."""
    fields = read_audit(data)
    return fields.hash if fields is not None else None


def chain_commit(actions: Sequence[Action], prev: str | None, key: bytes | None = None) -> bytes:
    """The commit file bytes of ``actions`` (commitInfo first) chained after ``prev``."""
    info = actions[0]
    if not isinstance(info, CommitInfo):
        raise ValueError("a chained commit starts with its commitInfo")
    audit: dict[str, str | None] = {"prev": prev, "hash": _ZERO}
    if key is not None:
        audit["hmac"] = _ZERO
    extra = {k: v for k, v in info.extra.items() if k != AUDIT_FIELD}
    extra[AUDIT_FIELD] = audit  # last key of the commitInfo line
    blank = encode_commit([dataclasses.replace(info, extra=extra), *actions[1:]])
    fields = read_audit(blank)
    assert fields is not None and fields.hash == _ZERO
    out = _put(blank, fields.hash_span, digest(blank))
    if key is not None and fields.hmac_span is not None:
        out = _put(out, fields.hmac_span, hmac_lib.new(key, blank, hashlib.sha256).hexdigest())
    return out


@dataclasses.dataclass(frozen=True)
class AuditFields:
    """The ``eventlog.audit`` field of one commit file, and where its values stand."""

    prev: str | None
    hash: str
    hmac: str | None
    hash_span: tuple[int, int]
    hmac_span: tuple[int, int] | None


def read_audit(data: bytes) -> AuditFields | None:
    """The audit field of a commit file's first line, or None for an unchained commit."""
    first = data.split(b"\n", 1)[0]
    match = _PATTERN.search(first)
    if match is None:
        return None
    prev = None if match.group(1) == b"null" else match.group(1).strip(b'"').decode()
    hmac_value = match.group(3).decode() if match.group(3) else None
    return AuditFields(
        prev, match.group(2).decode(), hmac_value, match.span(2), match.span(3) if match.group(3) else None
    )


def recompute(data: bytes, fields: AuditFields, key: bytes | None) -> tuple[str, str | None]:
    """(the content hash, the HMAC under ``key``) that ``data`` should carry."""
    blank = _put(data, fields.hash_span, _ZERO)
    if fields.hmac_span is not None:
        blank = _put(blank, fields.hmac_span, _ZERO)
    mac = hmac_lib.new(key, blank, hashlib.sha256).hexdigest() if key is not None else None
    return digest(blank), mac


def _put(data: bytes, span: tuple[int, int], value: str) -> bytes:
    return data[: span[0]] + value.encode() + data[span[1] :]
