"""What a trainer's CREDIT must be for the migrator to count it (``runtime.stages.migrator``).

A credit comes from a peer whose identity is a trainer's, signed with the run's key by that
trainer (its ``src``), numbered above the trainer's last (``cseq``: a copy sent again is
refused), and granted under the migrator's pipeline reset (``epoch``). A migrator started in
place of a dead one takes no credit of an earlier reset: the trainer granted those to the dead
one, and grants its whole window again when it takes the reset (``Batcher.reset``), so counting
them too would put more chunks in flight than its window holds.
"""

from __future__ import annotations

from runtime import wire

TRAINER_PREFIX = b"trainer-"
"""Only peers with this identity prefix (``topology.trainer_experience_in``) get chunks."""


class CreditCheck:
    """Args:
    key: The run's key (empty: no signature or numbering check, for tests that drive the
        migrator alone).
    epoch: The pipeline reset the migrator was started at (0: the run's first).
    """

    def __init__(self, key: bytes = b"", epoch: int = 0) -> None:
        self.key, self.epoch = key, epoch
        self.last: dict[bytes, int] = {}
        """Each trainer's newest ``cseq``."""

    def take(self, identity: bytes, msg: wire.Message) -> tuple[int, int] | None:
        """A credit's free chunk slots and the trainer's queued steps; None for one granted
        under an earlier reset (not counted, not malformed).

        Raises:
            wire.ProtocolError: not a CREDIT, not from a trainer, not signed by the trainer
                it came from, sent again, or a negative count.
        """
        if msg.type is not wire.MsgType.CREDIT:
            raise wire.ProtocolError(f"migrator takes only credit from trainers, got {msg.type}")
        if not identity.startswith(TRAINER_PREFIX):
            raise wire.ProtocolError(f"credit from {identity!r}, which is not a trainer")
        if self.key:
            wire.check_signed(self.key, msg)
            if msg.meta.get("src") != identity.decode(errors="replace"):
                signer = msg.meta.get("src")
                raise wire.ProtocolError(f"credit signed by {signer!r} came from {identity!r}")
        if msg.meta.get("epoch", 0) != self.epoch:
            return None
        n = wire.meta_int(msg.meta, "n")
        queued = wire.meta_int(msg.meta, "queued_steps", 0)
        if n < 0:
            raise wire.ProtocolError(f"credit of {n} slots; must be >= 0")
        if self.key:  # signed credits are numbered: one sent again is refused
            cseq = wire.meta_int(msg.meta, "cseq")
            if cseq <= self.last.get(identity, -1):
                raise wire.ProtocolError(
                    f"credit {cseq} from {identity!r} after its credit "
                    f"{self.last.get(identity, -1)}: sent again (replayed), or below 0"
                )
            self.last[identity] = cseq
        return n, queued
