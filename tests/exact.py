"""`same`: the exactness the caches and columns promise, as the tests check it."""

import dataclasses
import struct


def same(a, b):
    """Equal, of the same types throughout (1 is not 1.0 nor True; classes
    included), floats bit for bit (NaN, -0.0)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
