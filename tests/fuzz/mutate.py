"""A seeded mutation engine in plain Python: random byte edits, splices, interesting integers, and edits that know
the protobuf wire format or a text format's tokens. Deterministic: the same random.Random gives the same input."""
import re

# Integers at the edges that readers get wrong: sign and width boundaries, the datumfile's 100 MiB limit.
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 16, 0x7F, 0x80, 0xFF, 0x100, 0x3FF, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
               100 * 2 ** 20, 100 * 2 ** 20 + 1, 2 ** 24, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 53,
               2 ** 63 - 1, 2 ** 64 - 1]
INTERESTING_TEXT = ["0", "-1", "1", "-2147483648", "2147483647", "2147483648", "4294967295", "4294967296",
                    "9223372036854775808", "18446744073709551616", "1e39", "-1e39", "1e309", "nan", "-inf",
                    "0x7fffffff", "0xffffffffffffffff", "0.0000001", "99999999999999999999999999", '"\\xfc"',
                    '"\\377\\376"', '"\\u00e9"', '""', "{", "}", ":", "<", ">", "[", "]", "#", '"', "'", "\\"]
_TOKEN = re.compile(rb'"(?:[^"\\\n]|\\.)*"|[A-Za-z_][\w.]*|-?\d[\w.+-]*|\S')


def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _read_varint(data, pos, end):
    value, shift = 0, 0
    while pos < end and shift < 70:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value, pos
        shift += 7
    return None, pos


def wire_fields(data, start=0, end=None, depth=0, out=None):
    """Every field the bytes hold as protobuf wire format, nested messages too (length-delimited payloads that
    parse whole, up to 64 KiB and 4 levels deep): [(tag start, tag end, value start, value end, wire type)].
    A payload that does not parse adds nothing; what parsed before the damage is kept."""
    out = [] if out is None else out
    end = len(data) if end is None else end
    pos, found = start, []
    while pos < end:
        key, value_start = _read_varint(data, pos, end)
        if key is None or key >> 3 == 0:
            return out
        wire = key & 7
        if wire == 0:
            _, value_end = _read_varint(data, value_start, end)
        elif wire == 1:
            value_end = value_start + 8
        elif wire == 5:
            value_end = value_start + 4
        elif wire == 2:
            length, payload = _read_varint(data, value_start, end)
            if length is None:
                return out
            value_end = payload + length
        else:
            return out
        if value_end > end:
            return out
        found.append((pos, value_start, value_end, wire))
        pos = value_end
    out.extend(found)
    if depth < 4:
        for tag_start, value_start, value_end, wire in found:
            if wire == 2 and value_end - value_start <= 65536:
                _, payload = _read_varint(data, value_start, value_end)
                wire_fields(data, payload, value_end, depth + 1, out)
    return out


class Mutator:
    """Mutates inputs drawn from `seeds` (a list of bytes). `kinds` says which families of edits apply: "bytes"
    always, "proto" for protobuf wire format, "text" for prototxt-like text."""

    def __init__(self, seeds, kinds=("bytes",)):
        self.seeds = [bytes(s) for s in seeds]
        ops = [self.flip_bit, self.set_byte, self.set_int, self.insert, self.delete, self.duplicate,
               self.truncate, self.splice]
        if "proto" in kinds:
            ops += [self.proto_length, self.proto_wire_type, self.proto_varint, self.proto_drop, self.proto_repeat,
                    self.proto_bad_utf8] * 2
        if "text" in kinds:
            self.words = sorted({t for s in self.seeds for t in _TOKEN.findall(s) if t[:1].isalpha()})
            ops += [self.text_number, self.text_word, self.text_token, self.text_drop_token, self.text_lines] * 2
        self.ops = ops

    def mutate(self, rng, data=None):
        """A new input: a seed (or `data`) with 1 to 8 edits."""
        data = bytearray(rng.choice(self.seeds) if data is None else data)
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4, 8))):
            data = bytearray(rng.choice(self.ops)(rng, data))
        return bytes(data)

    # -- bytes --------------------------------------------------------------------------------------------------
    @staticmethod
    def _pos(rng, data, extra=0):
        return rng.randrange(len(data) + extra) if len(data) + extra else 0

    def flip_bit(self, rng, data):
        if data:
            data[self._pos(rng, data)] ^= 1 << rng.randrange(8)
        return data

    def set_byte(self, rng, data):
        if data:
            data[self._pos(rng, data)] = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        return data

    def set_int(self, rng, data):
        size = rng.choice((2, 4, 8))
        if len(data) < size:
            return data
        value = rng.choice(INTERESTING) + rng.choice((0, 0, -1, 1))
        pos = rng.randrange(len(data) - size + 1)
        if rng.random() < 0.5:       # aligned, where length fields usually are
            pos -= pos % size
        data[pos:pos + size] = (value % (1 << 8 * size)).to_bytes(size, rng.choice(("little", "big")))
        return data

    def insert(self, rng, data):
        count = rng.choice((1, 1, 2, 4, 16, 256))
        blob = bytes(rng.randrange(256) for _ in range(min(count, 16))) * max(1, count // 16)
        pos = self._pos(rng, data, 1)
        return data[:pos] + blob + data[pos:]

    def delete(self, rng, data):
        if not data:
            return data
        pos = self._pos(rng, data)
        return data[:pos] + data[pos + rng.choice((1, 1, 2, 4, 8, 64, 1024)):]

    def duplicate(self, rng, data):
        if not data:
            return data
        start = self._pos(rng, data)
        chunk = data[start:start + rng.choice((1, 4, 16, 256, 4096))]
        pos = self._pos(rng, data, 1)
        return data[:pos] + chunk + data[pos:]

    def truncate(self, rng, data):
        return data[:self._pos(rng, data, 1)]

    def splice(self, rng, data):
        other = rng.choice(self.seeds)
        return data[:self._pos(rng, data, 1)] + other[self._pos(rng, other, 1):]

    # -- protobuf wire format -----------------------------------------------------------------------------------
    def _field(self, rng, data, wires=(0, 1, 2, 5)):
        fields = [f for f in wire_fields(data) if f[3] in wires]
        return rng.choice(fields) if fields else None

    def proto_length(self, rng, data):
        """A length prefix set to an interesting value (the payload stays as it was)."""
        field = self._field(rng, data, (2,))
        if field is None:
            return self.set_int(rng, data)
        _, value_start, value_end, _ = field
        length, payload = _read_varint(data, value_start, value_end)
        new = rng.choice(INTERESTING + [length + 1, length - 1, length * 2])
        return data[:value_start] + varint(max(new, 0)) + data[payload:]

    def proto_wire_type(self, rng, data):
        field = self._field(rng, data)
        if field is None:
            return self.flip_bit(rng, data)
        tag_start, value_start, _, _ = field
        key, key_end = _read_varint(data, tag_start, value_start)
        return data[:tag_start] + varint((key & ~7) | rng.choice((0, 1, 2, 3, 4, 5, 6, 7))) + data[key_end:]

    def proto_varint(self, rng, data):
        field = self._field(rng, data, (0,))
        if field is None:
            return self.set_int(rng, data)
        _, value_start, value_end, _ = field
        value = rng.choice(INTERESTING) + rng.choice((0, -1, 1))
        return data[:value_start] + varint(value) + data[value_end:]

    def proto_drop(self, rng, data):
        field = self._field(rng, data)
        return data if field is None else data[:field[0]] + data[field[2]:]

    def proto_repeat(self, rng, data):
        field = self._field(rng, data)
        if field is None:
            return data
        chunk = data[field[0]:field[2]]
        return data[:field[0]] + chunk * rng.choice((2, 3)) + data[field[0]:]

    def proto_bad_utf8(self, rng, data):
        """A byte that is never UTF-8 into a short payload (names, types, paths are strings)."""
        fields = [f for f in wire_fields(data) if f[3] == 2 and f[2] - f[1] < 200]
        if not fields:
            return self.set_byte(rng, data)
        _, value_start, value_end, _ = rng.choice(fields)
        _, payload = _read_varint(data, value_start, value_end)
        if payload >= value_end:
            return data
        pos = rng.randrange(payload, value_end)
        data[pos] = rng.choice((0xFC, 0xFF, 0xC3, 0x80, 0xED))
        return data

    # -- text -----------------------------------------------------------------------------------------------------
    def _tokens(self, data):
        return [(m.start(), m.end()) for m in _TOKEN.finditer(bytes(data))]

    def _replace_token(self, rng, data, choose, only=None):
        tokens = [t for t in self._tokens(data) if only is None or only(bytes(data[t[0]:t[1]]))]
        if not tokens:
            return data
        start, end = rng.choice(tokens)
        return data[:start] + choose(rng) + data[end:]

    def text_number(self, rng, data):
        return self._replace_token(rng, data, lambda r: r.choice(INTERESTING_TEXT).encode(),
                                   lambda t: t[:1].isdigit() or t[:1] == b"-")

    def text_word(self, rng, data):
        if not self.words:
            return data
        return self._replace_token(rng, data, lambda r: r.choice(self.words), lambda t: t[:1].isalpha())

    def text_token(self, rng, data):
        """An interesting token or a known word inserted between two tokens."""
        pos = rng.choice([0] + [end for _, end in self._tokens(data)])
        word = rng.choice(INTERESTING_TEXT).encode() if rng.random() < 0.5 or not self.words else \
            rng.choice(self.words)
        return data[:pos] + b" " + word + b" " + data[pos:]

    def text_drop_token(self, rng, data):
        tokens = self._tokens(data)
        if not tokens:
            return data
        start, end = rng.choice(tokens)
        return data[:start] + data[end:]

    def text_lines(self, rng, data):
        """A run of lines deleted, repeated or moved."""
        lines = bytes(data).split(b"\n")
        i = rng.randrange(len(lines))
        j = min(len(lines), i + rng.choice((1, 2, 5, 20)))
        block = lines[i:j]
        choice = rng.randrange(3)
        if choice == 0:
            lines[i:j] = []
        elif choice == 1:
            lines[i:i] = block
        else:
            del lines[i:j]
            k = rng.randrange(len(lines) + 1)
            lines[k:k] = block
        return b"\n".join(lines)
