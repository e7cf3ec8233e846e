"""The config machinery: YAML in, validated immutable spec objects out.

A spec class is a frozen pydantic model whose unit-carrying fields are spelled with their SI
suffix (``frequency_Hz``).  Before pydantic sees the data, :func:`normalize` walks the input
alongside the model and rewrites every unit-suffixed key (``frequency_GHz: 1.41``) to the
canonical SI key (``frequency_Hz: 1.41e9``), rejecting unknown keys and units of the wrong
dimension.  Validation errors are mapped back to the key path and value *as the user wrote
them*, and raised as one :class:`~crossflow.errors.ConfigError`.
"""

from __future__ import annotations

import math
import re
import stat
import sys
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from crossflow import units
from crossflow.errors import ConfigError


class Spec(BaseModel):
    """Base of all config specs: immutable, strict types, no unknown keys."""

    # defer_build: a spec class's validator is built when it first validates, not when the
    # module is imported, so a command pays only for the specs it reads (`import crossflow`
    # 0.89x; a GEMM prediction reads most of them, 0.98x; docs/speed.md)
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, validate_default=True,
                              defer_build=True)
    _file: str | None = PrivateAttr(default=None)

    @property
    def source_file(self) -> str | None:
        """The YAML file this spec was read from (None for a dict)."""
        return self._file


# --- YAML ------------------------------------------------------------------------------------


#: The most values (scalars, lists and mappings, aliases counted at every place they are
#: used) a config document may hold: the largest shipped one holds ~200, and every later
#: step walks the expanded document, so ten nested levels of ten-fold aliases ("billion
#: laughs", 1e10 values from a few hundred bytes) must be refused before they are built.
MAX_NODES = 100_000


if getattr(yaml, "__with_libyaml__", False):
    from yaml._yaml import CParser

    class _Loader(Composer, CParser, SafeConstructor, Resolver):
        """PyYAML's safe loader with libyaml's scanner and parser, ~6x faster on the shipped
        configs (80 files: 21 vs 118 ms; most of reading a config file).  The composer stays
        PyYAML's: libyaml's recurses in C and crashes the process on a deeply nested
        document, where PyYAML's raises RecursionError (refused below)."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
else:  # PyYAML built without libyaml
    _Loader = yaml.SafeLoader  # type: ignore[misc,assignment]


class _UniqueKeyLoader(_Loader):
    """Safe loader that rejects duplicate keys (PyYAML silently keeps the last one) and
    documents that expand to more than :data:`MAX_NODES` values."""

    def get_single_data(self) -> Any:
        node = self.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return self.construct_document(node)


class _Refused(yaml.constructor.ConstructorError):
    """Well-formed YAML that is no config (too large once its aliases are expanded)."""


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a node graph whose expansion (each alias counted where it is used) holds more
    than :data:`MAX_NODES` nodes, or that contains itself.  Linear in the graph's size: a
    node's expanded count is computed once, however many aliases point to it."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    # iterative post-order walk: deep nesting is refused by size or depth, not RecursionError
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        ident = id(node)
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            open_.discard(ident)
            sizes[ident] = size = 1 + sum(sizes[id(c)] for c in children)
            if size > MAX_NODES:
                raise _Refused(
                    None, None, f"the document expands to more than {MAX_NODES:,} values "
                    f"(aliases counted each place they are used); a config holds a few "
                    f"hundred", node.start_mark)
            continue
        if ident in sizes:
            continue
        if ident in open_:
            raise _Refused(
                None, None, "an alias refers to a node that contains it", node.start_mark)
        open_.add(ident)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a plain name, not a {type(key).__name__} "
                f"('? ' complex keys are not config keys)", key_node.start_mark
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = True
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)

# --- numbers: the YAML 1.2 core schema ---
# PyYAML resolves plain scalars by YAML 1.1, where ``1:30`` is the sexagesimal 90, ``017``
# is octal 15, ``1_000`` is 1000 and ``1e5`` is a string.  Config numbers follow YAML 1.2
# core instead: decimal, ``0o`` octal, ``0x`` hex and plain floats; anything else is text,
# which validation then refuses where a number is wanted.
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeyLoader.add_implicit_resolver(  # before floats: the float pattern matches "17" too
    _INT_TAG, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))

#: Digits beyond which an integer is not parsed: far past :data:`MAX_MAGNITUDE`, and
#: Python refuses to parse more than 4300 digits at all.
_MAX_DIGITS = 40


class TooLarge(str):
    """A number written with more digits than any config value has (kept as its text, so
    :func:`check_numbers` can name the key that holds it)."""

    def __repr__(self) -> str:
        return str(self)


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int | TooLarge:
    text = loader.construct_scalar(node)
    body = text.lstrip("+-")
    sign = -1 if text.startswith("-") else 1
    if body.startswith("0o"):
        body, base = body[2:], 8
    elif body.startswith("0x"):
        body, base = body[2:], 16
    else:
        base = 10
    if len(body.lstrip("0")) > _MAX_DIGITS:
        return TooLarge(text)
    return sign * int(body, base)


def _construct_float(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> float | TooLarge:
    text = loader.construct_scalar(node)
    low = text.lower()
    if low.endswith((".inf", ".nan")):
        return float(low.replace(".", ""))  # -.inf -> -inf, .nan -> nan
    value = float(text)
    return TooLarge(text) if math.isinf(value) else value


_UniqueKeyLoader.add_constructor(_INT_TAG, _construct_int)
_UniqueKeyLoader.add_constructor(_FLOAT_TAG, _construct_float)


#: The largest config file read (bytes): the biggest shipped preset is ~10 KB; a larger
#: file is a mistake (a data file, a device such as /dev/zero), not a config.
MAX_FILE_BYTES = 16 * 2**20


def read_text(path: Path) -> str:
    """The text of a config file; a path that is not a readable regular file of at most
    :data:`MAX_FILE_BYTES` is a ConfigError naming it and saying why (nothing blocks: a
    FIFO or a device is refused before it is opened)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path)) from None
    except OSError as exc:  # a symlink loop, a name too long, a component not a directory
        raise ConfigError(f"cannot read the file ({exc.strerror or exc})",
                          file=str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError("is a directory, not a config file", file=str(path))
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError("is not a regular file (a device, FIFO or socket): configs are "
                          "read from YAML files", file=str(path))
    if st.st_size > MAX_FILE_BYTES:
        raise ConfigError(f"is {st.st_size / 2**20:.0f} MiB: too large for a config file "
                          f"(at most {MAX_FILE_BYTES // 2**20} MiB)", file=str(path))
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(MAX_FILE_BYTES + 1)
    except UnicodeDecodeError:
        raise ConfigError("is not UTF-8 text (a binary file?)", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the file ({exc.strerror or exc})",
                          file=str(path)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping from ``path``; any problem is a ConfigError naming the file."""
    path = Path(path)
    return parse_yaml(read_text(path), file=str(path))


def parse_yaml(text: str, *, file: str | None = None, key: str | None = None
               ) -> dict[str, Any]:
    """The YAML mapping ``text`` (a file's, named ``file``, or an option's inline value,
    named ``key``), read as config files are; any problem is a ConfigError naming it."""
    where_from = {"file": file} if file is not None else {"key": key, "value": text}
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - safe loader subclass
    except RecursionError:
        raise ConfigError("the YAML is nested too deeply (or an alias refers to itself)",
                          **where_from) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        what = "YAML refused" if isinstance(exc, _Refused) else "malformed YAML"
        raise ConfigError(f"{what}{where}: {problem}", **where_from) from None
    if not isinstance(data, dict):
        what = ("the file must hold a YAML mapping (key: value lines)" if file is not None
                else "an inline value must be a YAML mapping ({key: value, ...})")
        raise ConfigError(f"{what}, but holds {type(data).__name__}", **where_from)
    return data


# --- unit-key normalisation -----------------------------------------------------------------


def _spec_class(annotation: Any) -> type[Spec] | None:
    """The Spec subclass inside an annotation like ``Foo``, ``Foo | None`` (else None)."""
    if isinstance(annotation, type) and issubclass(annotation, Spec):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _spec_class(arg)
            if found is not None:
                return found
    if origin is typing.Annotated:
        return _spec_class(typing.get_args(annotation)[0])
    return None


def _container_item_spec(annotation: Any) -> tuple[str, type[Spec]] | None:
    """('seq', Foo) for tuple[Foo, ...] / list[Foo]; ('map', Foo) for dict[str, Foo]."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _container_item_spec(arg)
            if found is not None:
                return found
        return None
    args = typing.get_args(annotation)
    if origin in (tuple, list) and args:
        item = _spec_class(args[0])
        return ("seq", item) if item else None
    if origin is dict and len(args) == 2:
        item = _spec_class(args[1])
        return ("map", item) if item else None
    return None


def _allowed_keys(model: type[Spec]) -> str:
    shown = []
    for name in model.model_fields:
        parts = units.split_unit(name)
        if parts and parts[1] == units.CANONICAL.get(parts[1], units.DIMENSIONS[0]).canonical:
            dim = units.CANONICAL[parts[1]]
            shown.append(f"{parts[0]}_<{'|'.join(dim.factors)}>")
        else:
            shown.append(name)
    return ", ".join(shown)


def _path(prefix: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else str(key)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _convert(value: Any, suffix: str, path: str) -> Any:
    """Convert a number, or a mapping / list of numbers, from unit ``suffix`` to SI."""
    if _is_number(value):
        return units.to_si(value, suffix)
    if isinstance(value, Mapping):
        return {k: _convert(v, suffix, _path(path, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_convert(v, suffix, _path(path, i)) for i, v in enumerate(value)]
    raise ConfigError(f"must be a number in {suffix}", key=path, value=value)


def did_you_mean(name: str, known) -> str:
    """A misspelt key's or preset's likely meaning (``tensor_paralel``:
    ``tensor_parallel``), as a clause for the error; '' when nothing is close."""
    import difflib  # only on the error path: not part of a prediction's start-up

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.8)
    return f" (did you mean '{close[0]}'?)" if close else ""


def normalize(
    model: type[Spec], data: Any, prefix: str, keymap: dict[tuple, tuple[str, Any]],
    loc: tuple = (),
) -> Any:
    """Rewrite unit-suffixed keys of ``data`` to ``model``'s SI field names, recursively.

    ``keymap`` collects, for each rewritten pydantic location, the key path and the value as
    the user wrote them, so validation errors can quote the input.
    """
    if not isinstance(data, Mapping):
        return data  # pydantic reports the type error
    fields = model.model_fields
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = _path(prefix, key)
        if not isinstance(key, str):
            raise ConfigError("keys must be strings", key=path, value=key)
        name = key
        if key not in fields:
            parts = units.split_unit(key)
            canonical = units.canonical_key(key) if parts else None
            if canonical is not None and canonical in fields:
                value = _convert(value, parts[1], path)
                name = canonical
            else:
                # A known base with the wrong kind of unit gets a specific message.
                base = parts[0] if parts else key
                for field_name in fields:
                    field_parts = units.split_unit(field_name)
                    if field_parts and field_parts[0] == base:
                        dim = units.CANONICAL[field_parts[1]]
                        got = (
                            units.dimension_of(parts[1]).name if parts else "no unit suffix"
                        )
                        raise ConfigError(
                            f"'{base}' is a {dim.name}, but the key's unit is {got}",
                            key=path,
                            value=value,
                            allowed=f"{base}_<{'|'.join(dim.factors)}>",
                        )
                raise ConfigError(
                    f"unknown key '{key}' for {model.__name__}{did_you_mean(key, fields)}",
                    key=path,
                    value=value,
                    allowed=_allowed_keys(model),
                )
        if name in out:
            raise ConfigError(
                f"'{name}' is given twice (with different units)", key=path, value=value
            )
        keymap[loc + (name,)] = (path, data[key])
        annotation = fields[name].annotation
        nested = _spec_class(annotation)
        container = _container_item_spec(annotation)
        if nested is not None and isinstance(value, Mapping):
            value = normalize(nested, value, path, keymap, loc + (name,))
        elif container is not None:
            kind, item = container
            if kind == "seq" and isinstance(value, list | tuple):
                value = tuple(
                    normalize(item, v, _path(path, i), keymap, loc + (name, i))
                    for i, v in enumerate(value)
                )
            elif kind == "map" and isinstance(value, Mapping):
                value = {
                    k: normalize(item, v, _path(path, k), keymap, loc + (name, k))
                    for k, v in value.items()
                }
        out[name] = _tuples(value)
    return out


def _tuples(value: Any) -> Any:
    """YAML sequences become tuples: specs are immutable and use tuple fields (strict mode)."""
    if isinstance(value, list | tuple):
        return tuple(_tuples(v) for v in value)
    return value


#: Text that YAML 1.1 (but not 1.2) reads as a number: digit groups with ``_`` or ``:``.
_YAML11_NUMBER = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])*(?:\.[0-9_]*)?$")


def _error_from_pydantic(
    exc: ValidationError, keymap: dict[tuple, tuple[str, Any]], file: str | None
) -> ConfigError:
    """Every error pydantic found, in the file's terms (:meth:`ConfigError.together`: the
    first, with the others as its ``more``).  The failed branches of a union (a key that
    takes a name or a mapping) are one error: "must be a valid string or a valid
    dictionary" at the key, not one per branch at paths such as ``workload.str``."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for err in exc.errors(include_url=False):
        groups.setdefault(_union_at(tuple(err["loc"]), err, keymap), []).append(err)
    out = []
    for at, errs in groups.items():
        if len(errs) > 1 and at in keymap and all(
                len(e["loc"]) == len(at) + 1 and e["msg"].startswith("Input should be ")
                for e in errs):  # each branch refused the value's type
            path, value = keymap[at]
            wants = dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in errs)
            out.append(ConfigError("must be " + " or ".join(wants), file=file, key=path,
                                   value=value))
        else:
            out += [_one_error(e, keymap, file) for e in errs]
    return ConfigError.together(out)


def _union_at(loc: tuple, err: Mapping[str, Any], keymap: Mapping[tuple, Any]) -> tuple:
    """The key whose union type ``err`` is one failed branch of (its location goes on from
    that key by a branch's tag, a string that is no key of the file), else ``loc`` itself."""
    if err["type"] == "missing" or loc in keymap:
        return loc
    for cut in range(len(loc) - 1, 0, -1):
        if loc[:cut] in keymap:
            return loc[:cut] if isinstance(loc[cut], str) else loc
    return loc


def _one_error(err: Mapping[str, Any], keymap: dict[tuple, tuple[str, Any]],
               file: str | None) -> ConfigError:
    loc = tuple(err["loc"])
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "missing":
        field = loc[-1] if loc else "?"
        parent = ".".join(str(p) for p in loc[:-1])
        parent_path = keymap.get(loc[:-1], (parent, None))[0]
        shown = str(field)
        parts = units.split_unit(str(field))
        if parts and parts[1] in units.CANONICAL:
            dim = units.CANONICAL[parts[1]]
            shown = f"{parts[0]}_<{'|'.join(dim.factors)}>"
        return ConfigError(
            f"required key '{shown}' is missing",
            file=file,
            key=_path(parent_path, shown) if parent_path else shown,
        )
    if err["type"] in ("int_type", "float_type") and isinstance(err.get("input"), str) \
            and _YAML11_NUMBER.match(err["input"]) and any(c in err["input"] for c in "_:"):
        msg += (" (configs are read as YAML 1.2: sexagesimal 1:30, 1_000 and similar YAML 1.1 "
                "forms are text, not numbers; write the plain number)")
    if loc in keymap:
        path, value = keymap[loc]
        return ConfigError(msg, file=file, key=path, value=value)
    # Locations inside a value (e.g. a list element of plain values) or model-level checks.
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in keymap or cut == 0:
            base_path = keymap[loc[:cut]][0] if cut else ""
            rest = loc[cut:]
            path = base_path
            for part in rest:
                path = _path(path, part)
            value = err.get("input", ...)
            if isinstance(value, dict):
                value = ...
            return ConfigError(msg, file=file, key=path or None, value=value)
    raise AssertionError("unreachable")


def build(model: type[Spec], data: Mapping[str, Any], file: str | None = None) -> Spec:
    """Validate ``data`` (with unit-suffixed keys) into an instance of ``model``."""
    keymap: dict[tuple, tuple[str, Any]] = {}
    try:
        check_numbers(data)
        normalized = normalize(model, data, "", keymap)
        spec = model.model_validate(normalized)
        spec._file = file
        return spec
    except ConfigError as exc:
        raise exc.with_file(file) if file else exc from None
    except ValidationError as exc:
        raise _error_from_pydantic(exc, keymap, file) from None
    except RecursionError:
        raise ConfigError("the document is nested too deeply", file=file) from None


#: Nesting deeper than this is not a config (the deepest shipped preset is 6 levels deep).
MAX_DEPTH = 64


#: The largest magnitude a config number may have: a yotta (1e24) is beyond any quantity a
#: model takes (sizes, rates and counts are below ~1e18), and products of a few such
#: numbers stay far from float overflow (~1.8e308) and exact in Python ints.
MAX_MAGNITUDE = 10**24


def check_numbers(data: Any, key: str = "", depth: int = 0) -> None:
    """Reject every number no physical quantity takes: infinities, NaN, magnitudes above
    :data:`MAX_MAGNITUDE` (they overflow the model's arithmetic), denormals (below ~2.2e-308,
    a value that underflows it), and nesting deeper than :data:`MAX_DEPTH`.  Each error
    names the key path."""
    if depth > MAX_DEPTH:
        raise ConfigError(f"nested more than {MAX_DEPTH} levels deep", key=key or None)
    if isinstance(data, bool):
        return
    if isinstance(data, TooLarge) or (
            isinstance(data, int) and abs(data) > MAX_MAGNITUDE) or (
            isinstance(data, float) and math.isfinite(data) and abs(data) > MAX_MAGNITUDE):
        raise ConfigError("is too large to compute with", key=key or None, value=data,
                          allowed=f"a magnitude of at most {MAX_MAGNITUDE:.0e}")
    if isinstance(data, float):
        if not math.isfinite(data):
            raise ConfigError("must be a finite number", key=key or None, value=data)
        if data != 0 and abs(data) < sys.float_info.min:
            raise ConfigError("is too small to compute with (a denormal number)",
                              key=key or None, value=data,
                              allowed=f"0, or a magnitude of at least {sys.float_info.min:.3g}")
    elif isinstance(data, Mapping):
        for k, v in data.items():
            check_numbers(v, f"{key}.{k}" if key else str(k), depth + 1)
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            check_numbers(v, f"{key}[{i}]", depth + 1)
