"""Uid partitioning across frontend processes (thesis §2.5: partition W by uid).

Every user's weights live in exactly one partition, chosen by a stable hash of the uid, and a
frontend process serves and writes only the partitions it owns. All writes to one user's model
therefore happen in one process, so several frontends share a store without conflicting writes,
and a router in front of them sends each request to ``owner(uid)``.
"""

from __future__ import annotations

import hashlib

from inferline.core.errors import InferlineError, ValidationError

__all__ = ["WrongPartitionError", "check_uid", "partition_of"]

MAX_UID_LEN = 256


class WrongPartitionError(InferlineError):
    """The uid belongs to a partition this frontend does not own; route it to the owner.

    (Velox-local because core's errors have no "misdirected" kind; HTTP maps it to 421.)
    """

    def __init__(self, uid: str, partition: int, owned: tuple[int, ...]) -> None:
        self.uid = uid
        self.partition = partition
        self.owned = owned
        super().__init__(
            f"user {uid!r} is in partition {partition}, this frontend owns partitions {list(owned)}"
        )


def partition_of(uid: str, partitions: int) -> int:
    """Stable partition of a uid: blake2b, not ``hash()``, which is salted per process."""
    if partitions == 1:
        return 0
    h = hashlib.blake2b(uid.encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % partitions


def check_uid(uid: object) -> str:
    if not isinstance(uid, str) or not uid or len(uid) > MAX_UID_LEN:
        raise ValidationError("uid", f"a non-empty string of at most {MAX_UID_LEN} characters", uid)
    return uid
