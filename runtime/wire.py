"""The wire protocol: the one module that owns the bytes on every socket.

Every message is a ZeroMQ multipart message::

    frame 0   header   msgpack map {"v": PROTOCOL_VERSION, "t": <message type>,
                                    "m": {<type-specific metadata>},
                                    "a": [[<dtype str>, [<shape>...]], ...]}
    frame 1.. arrays   raw C-contiguous little-endian bytes, one frame per entry of "a"

Message types (``MsgType``) and who sends them:

    ROLLOUT  dispenser -> compressor   one channel of one rollout ([K, T, ...] or [K, T+1, ...])
    CHUNK    compressor -> migrator -> batcher
                                       one channel of several rollouts, concatenated on axis 0
    EOS      any stage -> the next     end of stream from that sender (drain)
    CREDIT   batcher -> migrator       "I have room for n more chunks"
    WEIGHTS  trainer -> actors         versioned policy parameters, one array per tensor
    STATS    any process -> runner     counters for the progress display and the summary
    COMMAND  runner -> stages          commands (drain, reset, retire, live settings, exit),
                                       signed and numbered (``runtime.commands``)
    RECEIPT  migrator -> actors        steps handed to a trainer (or given up, SETTLED), per
                                       actor incarnation
    RETIRE   migrator -> trainer       "train what you hold, hand the learner over, exit"
    INFER    actor -> inference GMI    observations [n, obs_dim] to act on (or to value)
    ACTIONS  inference GMI -> actor    the actions and log-probs (or values) for one INFER,
                                       with the policy version that produced them
    FIRST_CHUNK migrator -> batcher    a replacement migrator's first message: the lowest
                                       chunk id it routes
    SETTLED  compressor -> migrator    steps of rollouts it evicted, per actor incarnation,
                                       and the incarnations that ended (``runtime.stages.settled``)

Arrays above ``COPY_THRESHOLD`` bytes are sent zero-copy (pyzmq keeps a reference to the
buffer until it is on the wire; senders never mutate an array after sending it).
Nothing that comes off a socket is unpickled: only msgpack (plain types) and raw numeric
arrays of an allowed dtype are accepted. ``decode`` raises ``ProtocolError`` for anything
malformed; stages count and drop such messages (see ``MalformedCounter``).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import zmq

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
COPY_THRESHOLD = 64 * 1024
"""Frames at least this large are sent without copying (pyzmq's own default threshold)."""

MAX_HEADER_BYTES = 1 << 20
MAX_ARRAY_DIMS = 8
ALLOWED_DTYPES = frozenset(
    np.dtype(d).str
    for d in (
        "bool",
        "uint8",
        "int8",
        "uint16",
        "int16",
        "uint32",
        "int32",
        "uint64",
        "int64",
        "<f2",
        "<f4",
        "<f8",
    )
)


class MsgType(str, enum.Enum):
    """Message types; the value is what travels in the header."""

    ROLLOUT = "rollout"
    CHUNK = "chunk"
    EOS = "eos"
    CREDIT = "credit"
    WEIGHTS = "weights"
    STATS = "stats"
    COMMAND = "command"
    RECEIPT = "receipt"
    RETIRE = "retire"
    INFER = "infer"
    ACTIONS = "actions"
    FIRST_CHUNK = "first_chunk"
    SETTLED = "settled"


_TYPES_BY_VALUE = {t.value: t for t in MsgType}


class ProtocolError(ValueError):
    """A message that does not follow this protocol (wrong version, type, layout or dtype)."""


@dataclass
class Message:
    """A decoded message: its type, its metadata map and its arrays (read-only views)."""

    type: MsgType
    meta: dict[str, Any]
    arrays: list[np.ndarray] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Payload bytes of the arrays (the header is not counted)."""
        return sum(a.nbytes for a in self.arrays)


def meta_int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    """An integer header field, or ``ProtocolError`` naming the field (or ``default`` if absent)."""
    value = meta.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"header field {key!r} must be an integer, got {value!r}")
    return value


def _mac_arrays(mac: Any, arrays: Sequence[np.ndarray]) -> None:
    """Feeds each array's dtype, shape and bytes, as ``encode`` puts them on the wire, to
    ``mac``."""
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if not a.flags.c_contiguous:
            a = a.copy(order="C")
        mac.update(msgpack.packb([a.dtype.str, list(a.shape)]))
        if a.nbytes:
            mac.update(memoryview(a).cast("B"))


def weights_mac(
    key: bytes, version: int, names: Sequence[str], arrays: Sequence[np.ndarray]
) -> str:
    """HMAC-SHA256 (hex) of a WEIGHTS message's version, tensor names, dtypes, shapes and
    bytes under the run's weights key (``runtime.topology.Endpoints.run_key``)."""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    mac.update(msgpack.packb([version, list(names)]))
    _mac_arrays(mac, arrays)
    return mac.hexdigest()


SIG_HEX = 32
"""Hex digits of a message signature (128 bits of HMAC-SHA256)."""


def _signature(
    key: bytes, msg_type: MsgType, meta: dict[str, Any], arrays: Sequence[np.ndarray]
) -> str:
    mac = hmac.new(key, msgpack.packb([msg_type.value, meta], use_bin_type=True), hashlib.sha256)
    _mac_arrays(mac, arrays)
    return mac.hexdigest()[:SIG_HEX]


def sign(
    key: bytes, msg_type: MsgType, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()
) -> dict[str, Any]:
    """``meta`` with a ``sig``: an HMAC-SHA256 of the type, the metadata and the arrays (their
    dtypes, shapes and bytes) under the run's key. Nobody without the key can make a message
    that passes ``check_signed``, nor change a signed one's header or array bytes. A signed
    message copied and sent again is caught by its sequence number where it is received
    (``seq`` of a rollout, ``chunk`` of a chunk, ``cseq`` of a credit)."""
    return {**meta, "sig": _signature(key, msg_type, meta, arrays)}


def credit_meta(
    key: bytes, src: str, n: int, queued_steps: int, cseq: int, epoch: int = 0
) -> dict[str, Any]:
    """A trainer's CREDIT: ``n`` free chunk slots, its queued steps, its own name (``src``,
    its identity at the migrator), the credit's number (``cseq``, from 0, one up each credit:
    a copy sent again is refused) and the pipeline reset it was granted under (``epoch``: a
    migrator started in place of a dead one takes only its own epoch's, as the trainer grants
    its whole window again at the reset), signed with the run's key when there is one."""
    meta = {"n": n, "queued_steps": queued_steps, "src": src, "cseq": cseq, "epoch": epoch}
    return sign(key, MsgType.CREDIT, meta) if key else meta


def check_signed(key: bytes, msg: Message) -> None:
    """Raises ``ProtocolError`` unless ``msg`` carries a valid ``sig`` under ``key``."""
    meta = dict(msg.meta)
    given = meta.pop("sig", None)
    if not isinstance(given, str) or not hmac.compare_digest(
        given, _signature(key, msg.type, meta, msg.arrays)
    ):
        raise ProtocolError(
            f"{msg.type.value} message without a valid signature: not from this run's processes"
        )


def check_weights(key: bytes, msg: Message) -> tuple[int, list[str]]:
    """The version and tensor names of a WEIGHTS message signed with ``key``.

    Raises:
        ProtocolError: a malformed header, or a signature that does not match (weights not
            published by this run's trainer).
    """
    version = meta_int(msg.meta, "version")
    names = msg.meta.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ProtocolError("WEIGHTS header field 'names' must be a list of strings")
    given = msg.meta.get("mac")
    if not isinstance(given, str) or not hmac.compare_digest(
        given, weights_mac(key, version, names, msg.arrays)
    ):
        raise ProtocolError(f"forged WEIGHTS (version {version}): the signature does not match")
    return version, names


def meta_rollouts(meta: dict[str, Any]) -> list[list[int]]:
    """A chunk header's ``rollouts``: a list of ``[actor, inc, seq, steps, ...]`` int lists,
    or ``ProtocolError``."""
    rollouts = meta.get("rollouts")
    if not isinstance(rollouts, list) or not all(
        isinstance(r, list) and len(r) >= 4 and all(isinstance(x, int) for x in r) for r in rollouts
    ):
        raise ProtocolError(
            "chunk header field 'rollouts' must be a list of [actor, inc, seq, "
            f"steps], got {rollouts!r:.80}"
        )
    return rollouts


def encode(
    msg_type: MsgType, meta: dict[str, Any], arrays: Sequence[np.ndarray] = ()
) -> list[bytes | memoryview]:
    """Builds the frames of one message.

    Args:
        msg_type: The message type.
        meta: Metadata; plain msgpack types only (str, int, float, bool, None, list, dict).
        arrays: Numeric arrays; made C-contiguous little-endian if they are not.

    Returns:
        The frames: the packed header, then one buffer per array.

    Raises:
        ProtocolError: An array has a dtype this protocol does not carry.
    """
    specs = []
    frames: list[bytes | memoryview] = []
    for arr in arrays:
        arr = np.asarray(arr)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        dtype_str = arr.dtype.str
        if dtype_str not in ALLOWED_DTYPES:
            raise ProtocolError(
                f"cannot send an array of dtype {arr.dtype}; allowed: {sorted(ALLOWED_DTYPES)}"
            )
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        specs.append([dtype_str, list(arr.shape)])
        frames.append(memoryview(arr).cast("B") if arr.nbytes else b"")
    header = msgpack.packb(
        {"v": PROTOCOL_VERSION, "t": msg_type.value, "m": meta, "a": specs}, use_bin_type=True
    )
    return [header, *frames]


def decode(frames: Sequence[bytes | zmq.Frame | memoryview]) -> Message:
    """Parses and validates the frames of one message.

    Raises:
        ProtocolError: Malformed header, wrong protocol version, unknown type, or array frames
            that do not match their declared dtype and shape.
    """
    if not frames:
        raise ProtocolError("empty message")
    raw_header = _as_buffer(frames[0])
    if len(raw_header) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw_header)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = msgpack.unpackb(raw_header, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated exception types
        raise ProtocolError(f"header is not valid msgpack: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header must be a map, got {type(header).__name__}")
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r}; this build speaks {PROTOCOL_VERSION}")
    raw_type = header.get("t")
    msg_type = _TYPES_BY_VALUE.get(raw_type) if isinstance(raw_type, str) else None
    if msg_type is None:
        raise ProtocolError(f"unknown message type {header.get('t')!r}")
    meta = header.get("m")
    specs = header.get("a")
    if not isinstance(meta, dict) or not isinstance(specs, list):
        raise ProtocolError("header needs a metadata map 'm' and an array list 'a'")
    if len(specs) != len(frames) - 1:
        raise ProtocolError(f"header declares {len(specs)} arrays but {len(frames) - 1} follow")
    arrays = [_decode_array(spec, frame) for spec, frame in zip(specs, frames[1:], strict=True)]
    return Message(msg_type, meta, arrays)


def _decode_array(spec: Any, frame: bytes | zmq.Frame | memoryview) -> np.ndarray:
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], list)):
        raise ProtocolError(f"bad array spec {spec!r}; expected [dtype, shape]")
    dtype_str, shape = spec
    if not isinstance(dtype_str, str) or dtype_str not in ALLOWED_DTYPES:
        raise ProtocolError(f"array dtype {dtype_str!r} not allowed")
    if len(shape) > MAX_ARRAY_DIMS or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(f"bad array shape {shape!r} (at most {MAX_ARRAY_DIMS} dims)")
    dtype = np.dtype(dtype_str)
    buf = _as_buffer(frame)
    expected = dtype.itemsize * math.prod(shape)  # Python ints: no overflow
    if len(buf) != expected:
        raise ProtocolError(
            f"array frame has {len(buf)} bytes; {dtype_str}{shape} needs {expected}"
        )
    try:  # numpy refuses a dimension past its index range, even of a zero-size array
        return np.frombuffer(buf, dtype=dtype).reshape(shape)
    except (ValueError, OverflowError) as exc:
        raise ProtocolError(f"bad array shape {shape!r}: {exc}") from None


def _as_buffer(frame: bytes | zmq.Frame | memoryview) -> memoryview:
    if isinstance(frame, zmq.Frame):
        return frame.buffer
    return memoryview(frame)


def send(sock: zmq.Socket, frames: Sequence[bytes | memoryview], flags: int = 0) -> None:
    """Sends frames as one message, copying small frames and passing large ones zero-copy."""
    last = len(frames) - 1
    for i, frame in enumerate(frames):
        more = zmq.SNDMORE if i < last else 0
        sock.send(frame, flags | more, copy=len(frame) < COPY_THRESHOLD)


def send_msg(
    sock: zmq.Socket,
    msg_type: MsgType,
    meta: dict[str, Any],
    arrays: Sequence[np.ndarray] = (),
    flags: int = 0,
) -> int:
    """Encodes and sends one message; returns the payload bytes sent."""
    frames = encode(msg_type, meta, arrays)
    send(sock, frames, flags)
    return sum(len(f) for f in frames[1:])


def recv_msg(sock: zmq.Socket, flags: int = 0) -> Message:
    """Receives and decodes one message (large frames are not copied).

    Raises:
        ProtocolError: The message is malformed.
        zmq.Again: With ``zmq.NOBLOCK`` and nothing to read.
    """
    return decode(sock.recv_multipart(flags, copy=False))


def recv_waiting(
    sock: zmq.Socket, malformed: MalformedCounter, limit: int | None = None
) -> Iterator[Message]:
    """Yields the messages already waiting on ``sock`` (up to ``limit``), without blocking.

    Malformed ones are counted on ``malformed`` and skipped.
    """
    received = 0
    while limit is None or received < limit:
        try:
            msg = recv_msg(sock, zmq.NOBLOCK)
        except zmq.Again:
            return
        except ProtocolError as exc:
            malformed.drop(exc)
            continue
        received += 1
        yield msg


class MalformedCounter:
    """Counts malformed messages a stage dropped, logging one line for each."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.count = 0

    def drop(self, error: Exception) -> None:
        """Records one dropped message and logs why."""
        self.count += 1
        logger.warning("%s dropped malformed message #%d: %s", self.stage, self.count, error)
