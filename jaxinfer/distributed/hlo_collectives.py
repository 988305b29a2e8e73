"""The collectives of a compiled (SPMD-partitioned) XLA module, read from its HLO text.

Owns the parsing behind ``python -m jaxinfer.plan --compile`` (`jaxinfer.engine.step_check`):
given ``compiled.as_text()`` of a step, it lists every collective (all-reduce, all-gather,
reduce-scatter, all-to-all, collective-permute, and their async ``-start`` forms), with

  * where it runs: inside the decoder's layer loop (the ``while`` whose trip count is the
    layer count and whose state carries the ``[L, ...]`` KV cache: ``per_layer``), or once per
    step outside it; a collective under another loop counts once per trip;
  * its bytes per device (the result's; an all-gather's result is the gathered array);
  * its replica groups (the device ids of each group, from the iota or explicit form);
  * whether its operand is a weight (or the KV cache): the operand traced back through data movement only
    (bitcast, copy, convert, reshape, transpose, slices, tuple elements, loop state, called
    computations' parameters, and fusions made only of those) to an entry parameter whose
    ``op_name`` names the parameter tree (``variables['params']...``). A weight gathered or
    reduced whole is what tensor parallelism must never do; a product of a weight (a matmul
    output) is not "a weight".

Pure text processing: no JAX import. Written against XLA's HLO text of jaxlib 0.10
(``%name = type opcode(operands), attr=...`` lines; computations open with ``%name (...) ->
... {`` or ``ENTRY``).
"""
from __future__ import annotations

import dataclasses
import math
import re

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_MOVEMENT = {"bitcast", "copy", "convert", "reshape", "transpose", "slice", "dynamic-slice", "get-tuple-element",
             "bitcast-convert", "parameter", "constant", "tuple", "copy-start", "copy-done", "optimization-barrier"}
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
WEIGHT_PREFIX = "variables['params']"  # entry parameters of the parameter tree (`op_name` metadata)
STATE_PARAMS = ("k_cache", "v_cache")  # the KV cache's entry parameters: never to be moved either


@dataclasses.dataclass
class Instr:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    args: str = ""  # the raw text between the opcode's parentheses (a parameter's number)

    def attr(self, key: str) -> str | None:
        m = re.search(rf"\b{key}=(%[\w.\-]+|\{{[^}}]*\}}|[\w.\-]+)", self.attrs)
        return m.group(1) if m else None

    @property
    def op_name(self) -> str:
        m = re.search(r'op_name="((?:[^"\\]|\\.)*)"', self.attrs)
        return m.group(1).replace("\\'", "'") if m else ""


@dataclasses.dataclass
class Computation:
    name: str
    entry: bool
    instrs: dict[str, Instr]


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of the compiled module (bytes per device, per execution).

    Attributes:
      kind: one of `COLLECTIVE_KINDS`.
      bytes: bytes of its result on one device (for an all-gather: the gathered array).
      shape: the result's HLO type, e.g. ``f32[128,8192]``.
      per_layer: inside the decoder's layer loop (runs once per layer).
      count: how many times one step runs it (per layer: per layer; else per step).
      groups: the device-id groups it communicates within.
      weight: the parameter-tree path of the weight it moves whole (or ``k_cache`` / ``v_cache``:
        the KV cache), or "" (none).
      op_name: the JAX op it came from (its ``op_name`` metadata).
    """

    kind: str
    bytes: int
    shape: str
    per_layer: bool
    count: int
    groups: tuple[tuple[int, ...], ...]
    weight: str
    op_name: str


def _balanced(s: str, i: int) -> int:
    """Index just past the bracket group opening at ``s[i]`` ('(' or '{')."""
    open_, close = s[i], {"(": ")", "{": "}"}[s[i]]
    depth = 0
    for j in range(i, len(s)):
        if s[j] == open_:
            depth += 1
        elif s[j] == close:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(s)


def _parse_instr(line: str) -> Instr | None:
    m = re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*", line)
    if not m:
        return None
    rest = line[m.end():]
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.index(" ") if " " in rest else len(rest)
    typ, rest = rest[:end], rest[end:].lstrip()
    op = re.match(r"([\w\-]+)\(", rest)
    if not op:
        return None
    close = _balanced(rest, op.end() - 1)
    args = rest[op.end():close - 1]
    operands = re.findall(r"%([\w.\-]+)", args)
    return Instr(m.group(1), typ, op.group(1), operands, rest[close:], args)


def parse_module(text: str) -> dict[str, Computation]:
    """Computations of an HLO module's text by name (instructions in order)."""
    comps: dict[str, Computation] = {}
    cur = None
    for line in text.splitlines():
        head = re.match(r"(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            cur = Computation(head.group(2), bool(head.group(1)), {})
            comps[cur.name] = cur
            continue
        if line.startswith("}"):
            cur = None
            continue
        if cur is not None:
            ins = _parse_instr(line)
            if ins is not None:
                cur.instrs[ins.name] = ins
    return comps


def type_bytes(typ: str) -> int:
    """Bytes of an HLO type (a tuple's: the sum of its elements)."""
    total = 0
    for dt, dims in re.findall(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]", typ):
        if dt in _DTYPE_BYTES:
            total += _DTYPE_BYTES[dt] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def _array_dims(typ: str) -> list[list[int]]:
    return [[int(d) for d in dims.split(",") if d] for _, dims in re.findall(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]", typ)]


def _trip_count(ins: Instr) -> int | None:
    m = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
    return int(m.group(1)) if m else None


def _called(ins: Instr) -> list[str]:
    """Computations an instruction calls (fusion, call, while body, conditional branches, ...)."""
    out = []
    for key in ("calls", "body", "to_apply", "true_computation", "false_computation"):
        v = ins.attr(key)
        if v and v.startswith("%"):
            out.append(v[1:])
    for key in ("branch_computations", "called_computations"):
        v = ins.attr(key)
        if v:
            out += re.findall(r"%([\w.\-]+)", v)
    return out


def replica_groups(ins: Instr, num_devices: int | None = None) -> tuple[tuple[int, ...], ...]:
    """The device-id groups of a collective (``replica_groups={{0,1},{2,3}}``, the iota form
    ``[2,2]<=[4]`` or ``[2,2]<=[2,2]T(1,0)``, or a collective-permute's ``source_target_pairs``)."""
    m = re.search(r"replica_groups=\{((?:\{[0-9,]*\},?)*)\}", ins.attrs)
    if m:
        return tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([0-9,]*)\}", m.group(1)))
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", ins.attrs)
    if m:
        import numpy as np

        shape = [int(x) for x in m.group(1).split(",")]
        reshape = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(reshape)).reshape(reshape)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(shape))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", ins.attrs)
    if m:  # mesh form: mesh['a'=2,'b'=4] {'b'}: groups along the named axes
        import numpy as np

        axes = [(n, int(s)) for n, s in re.findall(r"'(\w+)'=(\d+)", m.group(1))]
        along = re.findall(r"'(\w+)'", m.group(2))
        names = [n for n, _ in axes]
        ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
        keep = [names.index(a) for a in along]
        rest = [i for i in range(len(names)) if i not in keep]
        ids = ids.transpose(rest + keep).reshape(-1, math.prod(axes[i][1] for i in keep) if keep else 1)
        return tuple(tuple(int(x) for x in row) for row in ids)
    m = re.search(r"source_target_pairs=\{(.*?)\}\}?", ins.attrs)
    if m:
        return tuple(tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", ins.attrs))
    return ()


def _kind(opcode: str) -> str | None:
    base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
    return base if base in COLLECTIVE_KINDS else None


class _Module:
    def __init__(self, text: str):
        self.comps = parse_module(text)
        self.entry = next(c for c in self.comps.values() if c.entry)
        self.callers: dict[str, tuple[Computation, Instr]] = {}
        for comp in self.comps.values():
            for ins in comp.instrs.values():
                for callee in _called(ins):
                    self.callers.setdefault(callee, (comp, ins))

    def _movement_only(self, comp_name: str) -> bool:
        comp = self.comps.get(comp_name)
        return comp is not None and all(i.opcode in _MOVEMENT for i in comp.instrs.values())

    def weight_origin(self, comp: Computation, name: str, tuple_index: int | None = None, depth: int = 0) -> str:
        """The parameter-tree path ``name`` moves whole, or "" (see the module docstring)."""
        if depth > 200:
            return ""
        ins = comp.instrs.get(name)
        if ins is None:
            return ""
        op = ins.opcode
        if op == "parameter":
            idx = int(ins.args.strip() or 0)
            if comp.entry:
                path = ins.op_name
                moved = path.startswith(WEIGHT_PREFIX) or path in STATE_PARAMS
                return path if moved and tuple_index is None else ""
            caller = self.callers.get(comp.name)
            if caller is None:
                return ""
            ccomp, cins = caller
            if cins.opcode == "while":  # loop state: the while's operand, element tuple_index
                return self.weight_origin(ccomp, cins.operands[0], tuple_index, depth + 1)
            if idx < len(cins.operands):
                return self.weight_origin(ccomp, cins.operands[idx], tuple_index, depth + 1)
            return ""
        if op == "get-tuple-element":
            index = int(ins.attr("index") or 0)
            return self.weight_origin(comp, ins.operands[0], index, depth + 1)
        if op == "tuple":
            if tuple_index is None or tuple_index >= len(ins.operands):
                return ""
            return self.weight_origin(comp, ins.operands[tuple_index], None, depth + 1)
        if op in ("dynamic-slice", "slice", "bitcast", "copy", "convert", "reshape", "transpose", "bitcast-convert",
                  "copy-done", "copy-start", "optimization-barrier"):
            return self.weight_origin(comp, ins.operands[0], tuple_index, depth + 1) if ins.operands else ""
        if op == "fusion" and self._movement_only(ins.attr("calls")[1:]):
            arrays = [o for o in ins.operands if comp.instrs.get(o) and _array_dims(comp.instrs[o].type)
                      and math.prod(_array_dims(comp.instrs[o].type)[0]) > 1]
            return self.weight_origin(comp, arrays[0], tuple_index, depth + 1) if len(arrays) == 1 else ""
        return ""


def _tuple_element(typ: str, i: int) -> str:
    """Element ``i`` of a tuple type ``(a, b, ...)`` (top level)."""
    inner, parts, depth, cur = typ[1:-1], [], 0, ""
    for ch in inner:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    parts = [re.sub(r"/\*.*?\*/", "", p).strip() for p in parts]
    return parts[i] if i < len(parts) else typ


def collectives(text: str, num_layers: int) -> list[Collective]:
    """Every collective of the compiled module's HLO ``text`` (module docstring).

    Args:
      num_layers: the decoder's layer count L (the trip count of its layer loop).
    """
    mod = _Module(text)
    out: list[Collective] = []

    def walk(comp: Computation, mult: int, in_layer: bool, seen: tuple[str, ...]):
        for ins in comp.instrs.values():
            kind = _kind(ins.opcode)
            if kind is not None:
                typ = ins.type
                if ins.opcode.endswith("-start") and typ.startswith("("):  # async: (operand, result, ...)
                    parts = _array_dims(typ)
                    typ = _tuple_element(typ, 1) if len(parts) > 1 else typ
                src = ins.operands[0] if ins.operands else ""
                out.append(Collective(kind, type_bytes(typ), typ, in_layer, mult, replica_groups(ins),
                                      mod.weight_origin(comp, src) if src else "", ins.op_name))
            for callee in _called(ins):
                if callee in seen or callee not in mod.comps:
                    continue
                layer_loop = False
                m = mult
                if ins.opcode == "while" and callee == (ins.attr("body") or "")[1:]:
                    n = _trip_count(ins) or 1
                    layer_loop = not in_layer and n == num_layers and any(
                        len(d) == 5 and d[0] == num_layers for d in _array_dims(ins.type))
                    m = mult if layer_loop else mult * n
                walk(mod.comps[callee], m, in_layer or layer_loop, seen + (callee,))

    walk(mod.entry, 1, False, (mod.entry.name,))
    return out
