"""The schema of a ``refconv bench`` results line, and a small checker for it.

``SCHEMA`` is written in the JSON-Schema vocabulary (the subset :func:`validate`
understands: ``type``, ``properties``, ``required``, ``additionalProperties``,
``items``, ``enum``, ``minimum``), so a JSON-Schema library accepts it too.
docs/cluster.md shows an annotated line.
"""

import json

_NUMBER = {"type": "number", "minimum": 0}
_PER_KIND = {"type": "object", "additionalProperties": _NUMBER}
_TIMES = {
    "type": "object",
    "required": ["min", "median", "max", "times"],
    "properties": {"min": _NUMBER, "median": _NUMBER, "max": _NUMBER,
                   "times": {"type": "array", "items": _NUMBER}},
}
_RANK = {
    "type": "object",
    "required": ["rank", "host", "local_rank", "local_size", "backend", "gpu", "gpu_id", "threads"],
    "properties": {"rank": {"type": "integer", "minimum": 0}, "host": {"type": "string"},
                   "local_rank": {"type": "integer", "minimum": 0}, "local_size": {"type": "integer", "minimum": 1},
                   "backend": {"enum": ["numpy", "cuda"]}, "gpu": {"type": ["integer", "null"]},
                   "gpu_id": {"type": ["string", "null"]}, "threads": {"type": "integer", "minimum": 1}},
}
ENV = {  # refconv info's record
    "type": "object",
    "required": ["versions", "mpi", "ranks"],
    "properties": {
        "versions": {"type": "object", "required": ["refconv", "python", "numpy", "numba", "numba-cuda", "cupy",
                                                    "mpi4py"],
                     "additionalProperties": {"type": "string"}},
        "mpi": {"type": "object", "required": ["library", "cuda_aware", "ranks"],
                "properties": {"library": {"type": "string"}, "cuda_aware": {"type": "boolean"},
                               "ranks": {"type": "integer", "minimum": 1}}},
        "ranks": {"type": "array", "items": _RANK},
    },
}
SCHEMA = {
    "type": "object",
    "required": ["schema", "bench", "label", "time", "env", "config", "passes", "bytes", "calls", "seconds",
                 "seconds_total", "wire_bytes", "extra"],
    "properties": {
        "schema": {"enum": ["refconv.bench/1"]},
        "bench": {"enum": ["kernels", "collectives", "layer", "step", "data"]},
        "label": {"type": "string"},                       # e.g. "sample=2,channel=2 stationary-x"
        "time": {"type": "string"},                        # ISO 8601, UTC
        "env": ENV,
        "config": {"type": "object", "required": ["ranks", "dtype", "repeat", "warmup"],
                   "properties": {"ranks": {"type": "integer", "minimum": 1},
                                  "grid": {"type": "object", "additionalProperties": {"type": "integer",
                                                                                       "minimum": 1}},
                                  "algorithm": {"type": "string"}, "batch": {"type": "integer", "minimum": 1},
                                  "dtype": {"enum": ["float32", "float64"]},
                                  "repeat": {"type": "integer", "minimum": 1},
                                  "warmup": {"type": "integer", "minimum": 0},
                                  "sweep": {"type": ["object", "null"]}}},
        "passes": {"type": "object", "additionalProperties": _TIMES},  # pass name -> seconds
        "bytes": _PER_KIND,                                 # kind of collective -> bytes per repetition
        "calls": _PER_KIND,
        "seconds_total": {"type": ["number", "null"], "minimum": 0},  # one repetition, slowest rank
        "seconds": _PER_KIND,                               # ... of which inside each kind of MPI call
        "wire_bytes": _PER_KIND,                            # the ring model's bytes on the wire
        "extra": {"type": "object"},
    },
}
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
          "integer": int, "number": (int, float)}


def _is(value, name):
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[name])


def validate(value, schema=SCHEMA, where="line"):
    """The list of problems of ``value`` against ``schema`` (empty: valid), each naming its place."""
    problems = []
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_is(value, t) for t in types):
            return [f"{where}: expected {' or '.join(types)}, got {type(value).__name__} {value!r:.60}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: expected one of {schema['enum']}, got {value!r}")
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        problems.append(f"{where}: expected >= {schema['minimum']}, got {value}")
    if isinstance(value, dict):
        problems += [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        properties = schema.get("properties", {})
        for key, item in value.items():
            sub = properties.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                problems += validate(item, sub, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += validate(item, schema["items"], f"{where}[{i}]")
    return problems


def read_lines(path):
    """The results lines of a JSON-lines file; ValueError naming the first line that is not one."""
    lines = []
    with open(path) as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON line ({exc.msg}); expected the output of "
                                 f"refconv bench --out or refconv sweep") from None
            problems = validate(line)
            if problems:
                raise ValueError(f"{path}:{number}: not a refconv bench results line: {problems[0]}")
            lines.append(line)
    return lines
