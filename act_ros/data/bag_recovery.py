"""Reading rosbag2 recordings that a crash or a power loss left incomplete.

``rosbags`` reads an MCAP file through its footer and summary (written only when the
recorder closes the file) and a SQLite3 bag through its ``metadata.yaml`` (written at the
end of recording as well). What a recorder that died leaves is readable anyway:

- an MCAP file is a sequence of records (schemas, channels, chunks of messages) from its
  start; :func:`scan_mcap` reads them in order and stops at the first record the file
  does not hold completely. Inside a chunk cut short, the messages that were fully
  written (and, compressed, fully decompressable) before the cut are kept;
- a SQLite3 bag's ``.db3`` files hold their topics and messages in tables; without
  ``metadata.yaml`` they are read directly (:func:`read_sqlite`).

Both give a :class:`RecoveredBag`, which acts like the part of a ``rosbags`` reader the
importer uses (``connections``, ``messages()``, ``deserialize()``) and says what it
recovered (:attr:`RecoveredBag.summary`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MCAP_MAGIC = b'\x89MCAP0\r\n'
_OP_HEADER, _OP_FOOTER, _OP_SCHEMA, _OP_CHANNEL, _OP_MESSAGE, _OP_CHUNK = 1, 2, 3, 4, 5, 6
_OP_DATA_END = 0x0F


class RecoveryError(ValueError):
    """Nothing could be read from the file (not MCAP, no message before the cut)."""


@dataclass(frozen=True)
class RecoveredConnection:
    """A topic of a recovered bag (what the importer reads of a rosbags Connection)."""

    id: int
    topic: str
    msgtype: str


class RecoveredBag:
    """The messages a damaged bag still holds, in the order they were written, read
    lazily (one chunk or query row at a time: memory does not grow with the bag)."""

    def __init__(self, path: Path, connections: list[RecoveredConnection],
                 source: Any, summary: str, typestore: Any, message_count: int,
                 complete: bool = False, defs: dict[str, tuple[str, str]] | None = None
                 ) -> None:
        self.path = path
        self.connections = connections
        self._source = source  # () -> iterator of (connection id, log time ns, raw CDR)
        self.summary = summary
        self.typestore = typestore
        self.message_count = message_count
        self.complete = complete
        self._defs = defs or {}

    def messages(self, connections: list[RecoveredConnection] | None = None
                 ) -> Iterator[tuple[RecoveredConnection, int, bytes]]:
        wanted = {c.id: c for c in (connections or self.connections)}
        for cid, stamp, raw in self._source():
            conn = wanted.get(cid)
            if conn is not None:
                yield conn, stamp, raw

    def deserialize(self, raw: bytes, msgtype: str) -> Any:
        store = self.typestore
        if msgtype not in store.types and msgtype in self._defs:
            from rosbags.typesys import get_types_from_msg

            encoding, text = self._defs[msgtype]
            if encoding == 'ros2msg':
                store.register(get_types_from_msg(text, msgtype))
        return store.deserialize_cdr(raw, msgtype)

    def __enter__(self) -> RecoveredBag:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def mcap_files(bag: Path) -> list[Path]:
    """The ``.mcap`` files of a bag (a directory or one file)."""
    if bag.is_file():
        return [bag] if bag.suffix == '.mcap' else []
    return sorted(bag.glob('*.mcap')) if bag.is_dir() else []


def db3_files(bag: Path) -> list[Path]:
    if bag.is_file():
        return [bag] if bag.suffix == '.db3' else []
    return sorted(bag.glob('*.db3')) if bag.is_dir() else []


def _u16(b: Any, at: int) -> int:
    return struct.unpack_from('<H', b, at)[0]


def _u32(b: Any, at: int) -> int:
    return struct.unpack_from('<I', b, at)[0]


def _u64(b: Any, at: int) -> int:
    return struct.unpack_from('<Q', b, at)[0]


def _string(b: Any, at: int) -> tuple[str, int]:
    n = _u32(b, at)
    return bytes(b[at + 4:at + 4 + n]).decode(), at + 4 + n


def _partial_decompress(data: bytes, compression: str) -> bytes:
    """As much of a (possibly cut) compressed chunk as decompresses."""
    if compression == '':
        return data
    if compression == 'zstd':
        try:
            from compression import zstd  # Python >= 3.14
        except ImportError:
            from backports import zstd
        try:
            return zstd.ZstdDecompressor().decompress(data)
        except Exception:  # noqa: BLE001 - a corrupt tail: nothing more to read
            return b''
    if compression == 'lz4':
        import lz4.frame

        try:
            return lz4.frame.LZ4FrameDecompressor().decompress(data)
        except Exception:  # noqa: BLE001
            return b''
    raise RecoveryError(f'unsupported MCAP chunk compression {compression!r}')


class _McapScan:
    """Records of one MCAP file from its start up to its end or its first cut record;
    :meth:`run` yields the messages (chunk by chunk) and fills in the schemas, channels,
    whether a footer was found and where the file was cut."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.schemas: dict[int, tuple[str, str, str]] = {}  # id -> (name, encoding, text)
        self.channels: dict[int, tuple[str, int]] = {}  # id -> (topic, schema id)
        self.footer = False
        self.cut = ''  # where and how the file ends early
        self.count = 0
        self.first = self.last = None

    def run(self) -> Iterator[tuple[int, int, bytes]]:
        import mmap

        with self.path.open('rb') as f:
            size = self.path.stat().st_size
            if size == 0:
                raise RecoveryError(f'{self.path}: empty file')
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            try:
                yield from self._scan(data, size)
            finally:
                data.close()

    def _note(self, messages: list[tuple[int, int, bytes]]) -> None:
        for _, t, _ in messages:
            self.count += 1
            self.first = t if self.first is None else min(self.first, t)
            self.last = t if self.last is None else max(self.last, t)

    def _scan(self, data: Any, size: int) -> Iterator[tuple[int, int, bytes]]:
        if data[:len(MCAP_MAGIC)] != MCAP_MAGIC:
            raise RecoveryError(f'{self.path}: not an MCAP file (its first bytes are '
                                f'{bytes(data[:8])!r}, expected {MCAP_MAGIC!r})')
        at = len(MCAP_MAGIC)
        while at < size:
            if at + 9 > size:
                self.cut = f'inside a record header at byte {at} of {size}'
                return
            op, length = data[at], _u64(data, at + 1)
            body_at = at + 9
            if op == _OP_CHUNK:
                messages = self._chunk(data, body_at, length, size)
                self._note(messages)
                yield from messages
                if self.cut:
                    return
            elif body_at + length > size:
                self.cut = f'inside a record (op 0x{op:02x}) at byte {at} of {size}'
                return
            elif op in (_OP_FOOTER, _OP_DATA_END):
                self.footer = True  # the data section is complete; the summary follows
                return
            else:
                message = self._record(op, data[body_at:body_at + length])
                if message is not None:
                    self._note([message])
                    yield message
            at = body_at + length

    def _record(self, op: int, body: Any) -> tuple[int, int, bytes] | None:
        if op == _OP_SCHEMA:
            sid = _u16(body, 0)
            name, at = _string(body, 2)
            encoding, at = _string(body, at)
            n = _u32(body, at)
            self.schemas[sid] = (name, encoding,
                                 bytes(body[at + 4:at + 4 + n]).decode(errors='replace'))
        elif op == _OP_CHANNEL:
            cid, sid = _u16(body, 0), _u16(body, 2)
            topic, _ = _string(body, 4)
            self.channels[cid] = (topic, sid)
        elif op == _OP_MESSAGE and len(body) >= 22:
            return _u16(body, 0), _u64(body, 6), bytes(body[22:])
        return None

    def _chunk(self, data: Any, at: int, length: int, size: int) -> list[tuple[int, int, bytes]]:
        end = min(at + length, size)
        if at + 32 > size or at + 32 + _u32(data, at + 28) + 8 > size:
            self.cut = f'inside a chunk header at byte {at - 9} of {size}'
            return []
        uncompressed_size = _u64(data, at + 16)
        compression, pos = _string(data, at + 28)
        compressed_size = _u64(data, pos)
        start = pos + 8
        whole = at + length <= size and start + compressed_size <= end
        payload = bytes(data[start:min(start + compressed_size, end)])
        if whole:
            from rosbags.rosbag2.storage_mcap import decompress

            raw = decompress(payload, compression, uncompressed_size, 0)
        else:
            raw = _partial_decompress(payload, compression)
        messages = []
        sub = 0
        while sub + 9 <= len(raw):
            op, n = raw[sub], _u64(raw, sub + 1)
            if sub + 9 + n > len(raw):
                break  # a record cut by the end of the file
            message = self._record(op, raw[sub + 9:sub + 9 + n])
            if message is not None:
                messages.append(message)
            sub += 9 + n
        messages.sort(key=lambda m: m[1])
        if not whole:
            self.cut = (f'inside a chunk at byte {end} of {size} ({len(messages)} whole '
                        'message(s) of that chunk recovered)')
        return messages


def scan_mcap(path: Path, typestore: Any) -> RecoveredBag:
    """Every whole message of the MCAP file(s) of ``path``, with or without footer and
    index. One pass finds the topics and counts; the messages are read again lazily."""
    files = mcap_files(path)
    if not files:
        raise RecoveryError(f'{path}: no .mcap file')
    scans = []
    for file in files:
        scan = _McapScan(file)
        for _ in scan.run():
            pass
        scans.append(scan)
    connections: dict[tuple[str, str], RecoveredConnection] = {}
    ids: list[dict[int, int]] = []
    defs: dict[str, tuple[str, str]] = {}
    for scan in scans:
        mapping = {}
        for cid, (topic, sid) in scan.channels.items():
            name, encoding, text = scan.schemas.get(sid, ('', '', ''))
            key = (topic, name)
            if key not in connections:
                connections[key] = RecoveredConnection(len(connections), topic, name)
            mapping[cid] = connections[key].id
            defs.setdefault(name, (encoding, text))
        ids.append(mapping)
    count = sum(s.count for s in scans)
    cuts = [f'{s.path.name} ends {s.cut}' for s in scans if s.cut]
    if not count:
        raise RecoveryError(f'{path}: no whole message before the end of the file '
                            f'({"; ".join(cuts) or "no message record"})')
    no_footer = [f'{s.path.name} ends between two records at byte {s.path.stat().st_size} '
                 '(no footer or index)' for s in scans if not s.footer and not s.cut]
    first = min(s.first for s in scans if s.first is not None)
    last = max(s.last for s in scans if s.last is not None)
    where = '; '.join(cuts + no_footer) or 'complete'

    summary = (f'{path}: recovered {count} message(s) on {len(connections)} topic(s), log '
               f'time {first * 1e-9:.3f} to {last * 1e-9:.3f} s ({(last - first) * 1e-9:.1f} '
               f's); {where}')

    def source() -> Iterator[tuple[int, int, bytes]]:
        for file, mapping in zip(files, ids):
            for cid, t, raw in _McapScan(file).run():
                if cid in mapping:
                    yield mapping[cid], t, raw

    return RecoveredBag(path, list(connections.values()), source, summary, typestore, count,
                        complete=not cuts and not no_footer, defs=defs)


def read_sqlite(path: Path, typestore: Any) -> RecoveredBag:
    """Every message of a SQLite3 bag's ``.db3`` files, without ``metadata.yaml``."""
    import sqlite3

    files = db3_files(path)
    if not files:
        raise RecoveryError(f'{path}: no .db3 file')
    connections: dict[tuple[str, str], RecoveredConnection] = {}
    ids: list[dict[int, int]] = []
    count, first, last = 0, None, None
    for file in files:
        try:
            db = sqlite3.connect(f'file:{file}?mode=ro', uri=True)
            try:
                mapping = {}
                for tid, name, msgtype in db.execute('SELECT id, name, type FROM topics'):
                    key = (name, msgtype)
                    if key not in connections:
                        connections[key] = RecoveredConnection(len(connections), name, msgtype)
                    mapping[tid] = connections[key].id
                n, lo, hi = db.execute('SELECT COUNT(*), MIN(timestamp), MAX(timestamp) '
                                       'FROM messages').fetchone()
            finally:
                db.close()
        except sqlite3.DatabaseError as exc:
            raise RecoveryError(f'{file}: not a readable SQLite3 bag ({exc})') from exc
        ids.append(mapping)
        if n:
            count += n
            first = lo if first is None else min(first, lo)
            last = hi if last is None else max(last, hi)
    if not count:
        raise RecoveryError(f'{path}: the .db3 file(s) hold no message')
    summary = (f'{path}: no metadata.yaml; read {count} message(s) on {len(connections)} '
               f'topic(s) from {", ".join(f.name for f in files)} directly, log time '
               f'{first * 1e-9:.3f} to {last * 1e-9:.3f} s ({(last - first) * 1e-9:.1f} s)')

    def source() -> Iterator[tuple[int, int, bytes]]:
        for file, mapping in zip(files, ids):
            db = sqlite3.connect(f'file:{file}?mode=ro', uri=True)
            try:
                for tid, stamp, raw in db.execute(
                        'SELECT topic_id, timestamp, data FROM messages ORDER BY timestamp'):
                    if tid in mapping:
                        yield mapping[tid], int(stamp), bytes(raw)
            finally:
                db.close()

    return RecoveredBag(path, list(connections.values()), source, summary, typestore, count)


SQLITE_MAGIC = b'SQLite format 3\x00'
ROS1_MAGIC = b'#ROSBAG'


def _head_tail(file: Path, n: int) -> tuple[bytes, bytes, int]:
    size = file.stat().st_size
    with file.open('rb') as f:
        head = f.read(n)
        f.seek(max(0, size - n))
        return head, f.read(n), size


@dataclass(frozen=True)
class Diagnosis:
    """What a look at a bag's files says: whether it is a recording cut short, and what
    was found (where it ends, or what is wrong with it)."""

    cut_short: bool
    what: str


def diagnose(path: Path) -> Diagnosis:
    """Whether ``path`` is a recording cut short (a recorder that crashed or lost power):
    its files start as a rosbag2 recording's do but its end is missing (an MCAP file
    without footer or index, or cut inside a record; a bag directory without
    ``metadata.yaml``). Anything else that keeps a bag from opening (a corrupt header,
    another format) is not, and no recovery may paper over it: ``what`` then says what was
    found, or is empty when these checks find nothing wrong."""
    path = Path(path)
    files = [path] if path.is_file() else (sorted(p for p in path.iterdir() if p.is_file())
                                           if path.is_dir() else [])
    if any(_head_tail(f, len(ROS1_MAGIC))[0] == ROS1_MAGIC for f in files[:20]):
        return Diagnosis(False, 'a ROS 1 bag, expected rosbag2 (MCAP or SQLite3): convert it '
                                'with `rosbags-convert`')
    mcaps, dbs = mcap_files(path), db3_files(path)
    if not mcaps and not dbs:
        names = ', '.join(f.name for f in files[:6]) + (', ...' if len(files) > 6 else '')
        return Diagnosis(False, 'expected a rosbag2 directory or an .mcap / .db3 file, found '
                                f'{names or "no file"}')
    ends = []
    for file in mcaps:
        head, tail, size = _head_tail(file, len(MCAP_MAGIC))
        if head != MCAP_MAGIC:
            return Diagnosis(False, f'{file.name} is not an MCAP file (its first bytes are '
                                    f'{head!r}, expected {MCAP_MAGIC!r})')
        if size < 2 * len(MCAP_MAGIC) or tail != MCAP_MAGIC:
            ends.append(f'{file.name} ends at byte {size} without its footer')
    for file in dbs:
        head, _, _ = _head_tail(file, len(SQLITE_MAGIC))
        if head != SQLITE_MAGIC:
            return Diagnosis(False, f'{file.name} is not an SQLite3 database (its first bytes '
                                    f'are {head!r})')
    if ends:
        return Diagnosis(True, '; '.join(ends))
    if path.is_dir() and not (path / 'metadata.yaml').exists():
        return Diagnosis(True, 'no metadata.yaml (written when a recording ends)')
    return Diagnosis(False, '')


def recover(path: Path, typestore: Any) -> RecoveredBag:
    """A damaged bag's readable part: MCAP files scanned, or ``.db3`` files read
    directly (RecoveryError when neither applies)."""
    if mcap_files(path):
        return scan_mcap(path, typestore)
    if db3_files(path):
        return read_sqlite(path, typestore)
    raise RecoveryError(f'{path}: neither .mcap nor .db3 files to recover from')
