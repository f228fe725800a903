"""TF Serving's model set: ``ModelServerConfig`` entries, their text form, and the reload rule.

TF Serving's ``ModelService/HandleReloadConfigRequest`` *replaces* the server's whole model
set: a model missing from the new list is unloaded. So the adapter keeps, per server, the set
it knows (``ServedModel`` entries) and always sends all of it, changed or not.

The text form is protobuf text format of ``tensorflow.serving.ModelServerConfig`` as in a
``--model_config_file``::

    model_config_list {
      config { name: "mlp" base_path: "/models/mlp" model_platform: "tensorflow" }
    }

An entry read from the operator's config (``parse_text``, ``from_proto``) keeps its own text
(``ServedModel.text``): ``format_text`` and ``to_proto`` send that text back unchanged, so every
``ModelConfig`` field of a model inferline does not manage (version policy, version labels,
logging config, fields this module does not know) survives every reload exactly. Only the
entries inferline writes itself are built from the fields. ``parse_text`` reads the fields
inferline needs (``name``, ``base_path``, ``model_platform``, the version policy
``specific`` / ``latest`` / ``all`` and ``version_labels``) without the generated stubs, so
discovery works over REST alone.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from inferline.core import ValidationError

__all__ = [
    "ServedModel",
    "format_text",
    "from_proto",
    "merged",
    "parse_text",
    "to_proto",
    "without_labels",
]


@dataclass(frozen=True)
class ServedModel:
    """One entry of a server's model set.

    The version policy is one of ``versions`` (``specific``), ``latest`` (``latest {
    num_versions }``, 0 meaning TF Serving's default of 1) or ``all_versions``; none set is
    TF Serving's default policy (the latest version). ``labels``: ``version_labels`` as
    (label, version) pairs. ``text``: the entry's protobuf text as the operator wrote it
    (sent back verbatim; not compared: equality is on the fields above)."""

    name: str
    base_path: str
    platform: str = "tensorflow"
    versions: tuple[int, ...] | None = None
    latest: int | None = None
    all_versions: bool = False
    labels: tuple[tuple[str, int], ...] = ()
    text: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError("model name", "a non-empty string", self.name)
        if not isinstance(self.base_path, str) or not self.base_path:
            raise ValidationError(
                f"{self.name}.base_path", "a model directory path", self.base_path
            )
        policies = [self.versions is not None, self.latest is not None, self.all_versions]
        if sum(policies) > 1:
            raise ValidationError(
                f"{self.name}.model_version_policy",
                "one of specific, latest or all",
                self.to_dict(),
            )

    @property
    def policy(self) -> tuple[str, Any]:
        """``("specific", versions)``, ``("latest", n)`` or ``("all", None)``."""
        if self.versions is not None:
            return "specific", self.versions
        if self.all_versions:
            return "all", None
        return "latest", max(1, self.latest or 0)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "base_path": self.base_path,
            "platform": self.platform,
        }
        if self.versions is not None:
            d["versions"] = list(self.versions)
        if self.latest is not None:
            d["latest"] = self.latest
        if self.all_versions:
            d["all_versions"] = True
        if self.labels:
            d["labels"] = dict(self.labels)
        if self.text is not None:
            d["text"] = self.text
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServedModel:
        v = d.get("versions")
        n = d.get("latest")
        labels = d.get("labels") or {}
        if not isinstance(labels, Mapping):
            raise ValidationError(f"{d.get('name')}.labels", "a {label: version} map", labels)
        return cls(
            str(d.get("name", "")),
            str(d.get("base_path", "")),
            str(d.get("platform", "tensorflow")),
            None if v is None else tuple(int(x) for x in v),
            None if n is None else int(n),
            bool(d.get("all_versions", False)),
            tuple(sorted((str(k), int(x)) for k, x in labels.items())),
            None if d.get("text") is None else str(d["text"]),
        )


def merged(
    current: Mapping[str, ServedModel],
    put: Sequence[ServedModel] = (),
    drop: Sequence[str] = (),
) -> dict[str, ServedModel]:
    """The model set to send: ``current`` with ``put`` replaced in place or appended and
    ``drop`` removed. Every other entry is passed on as the same object (its own text)."""
    out = {k: v for k, v in current.items() if k not in drop}
    for m in put:
        out[m.name] = m
    return out


def without_labels(m: ServedModel) -> ServedModel:
    """``m`` with no ``version_labels`` and every other field as it is (its text re-written by
    protobuf): the first step of loading a labelled model, as TF Serving accepts a label only
    for a version that is already AVAILABLE."""
    if m.text is None:
        return replace(m, labels=())
    from google.protobuf import text_format

    from ._protos import stubs

    c = stubs().model_server_config_pb2.ModelConfig()
    text_format.Parse(m.text, c)
    c.ClearField("version_labels")
    return replace(m, labels=(), text=text_format.MessageToString(c, as_utf8=True).strip())


# -- text format --------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(#[^\n]*)"
    r"|(\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*')"
    r"|(-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fFuUlL]*))"
    r"|(-?[A-Za-z_][\w.]*)"
    r"|([{}:<>\[\],;]))"
)
_Tok = tuple[str, int, int]  # token, start, end in the text


def _tokens(text: str) -> list[_Tok]:
    out = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise ValidationError("model config", "protobuf text format", text[pos : pos + 30])
        pos = m.end()
        if m.group(1):
            continue
        i = next(k for k in range(2, 6) if m.group(k) is not None)
        out.append((m.group(i), m.start(i), m.end(i)))
    return out


def _unquote(v: str) -> str:
    # protobuf's C escapes (\n, \", \ooo, \xhh) over UTF-8 bytes
    try:
        raw = codecs.escape_decode(v[1:-1].encode("utf-8"))[0]
        return bytes(raw).decode("utf-8")
    except (ValueError, UnicodeDecodeError) as e:
        raise ValidationError("model config", "a valid string literal", v) from e


_Msg = dict[str, list[Any]]
_SPAN = ""  # key of a block's (start, end) in the text; no field has an empty name


def _value(toks: list[_Tok], i: int) -> tuple[Any, int]:
    t = toks[i][0]
    if t in ("{", "<"):
        return _parse_block(toks, i + 1, "}" if t == "{" else ">")
    if t[0] in "\"'":
        s = _unquote(t)
        i += 1
        while i < len(toks) and toks[i][0][0] in "\"'":  # adjacent literals concatenate
            s += _unquote(toks[i][0])
            i += 1
        return s, i
    if t in ("}", ">", "]", ":", ",", ";", "["):
        raise ValidationError("model config", "a value", t)
    return t, i + 1


def _parse_block(toks: list[_Tok], i: int, end: str | None) -> tuple[_Msg, int]:
    msg: _Msg = {_SPAN: [toks[i][1] if i < len(toks) else 0, None]}
    last_end = msg[_SPAN][0]
    while i < len(toks):
        t = toks[i][0]
        if t == end:
            msg[_SPAN][1] = last_end
            return msg, i + 1
        if not re.match(r"[A-Za-z_]", t):
            raise ValidationError("model config", "a field name", t)
        i += 1
        if i < len(toks) and toks[i][0] == ":":
            i += 1
        if i >= len(toks):
            break
        if toks[i][0] == "[":  # list form: versions: [1, 2]
            i += 1
            while i < len(toks) and toks[i][0] != "]":
                v, i = _value(toks, i)
                msg.setdefault(t, []).append(v)
                if i < len(toks) and toks[i][0] == ",":
                    i += 1
            i += 1
        else:
            v, i = _value(toks, i)
            msg.setdefault(t, []).append(v)
        last_end = toks[i - 1][2]
        if i < len(toks) and toks[i][0] in (",", ";"):
            i += 1
    if end is not None:
        raise ValidationError("model config", f"a closing {end!r}", "end of text")
    msg[_SPAN][1] = last_end
    return msg, i


def _one(c: _Msg, key: str, default: Any) -> Any:
    vals = c.get(key)
    return vals[-1] if vals else default


def _entry(c: _Msg, text: str) -> ServedModel:
    name = str(_one(c, "name", ""))
    versions: tuple[int, ...] | None = None
    latest: int | None = None
    all_versions = False
    for pol in c.get("model_version_policy", []):
        if "specific" in pol:
            versions = tuple(int(v, 0) for s in pol["specific"] for v in s.get("versions", []))
        elif "latest" in pol:
            latest = int(_one(pol["latest"][-1], "num_versions", "0"), 0)
        elif "all" in pol:
            all_versions = True
    labels = {
        str(_one(kv, "key", "")): int(_one(kv, "value", "0"), 0)
        for kv in c.get("version_labels", [])
    }
    start, end = c[_SPAN]
    return ServedModel(
        name,
        str(_one(c, "base_path", "")),
        str(_one(c, "model_platform", "tensorflow")),
        versions,
        latest,
        all_versions,
        tuple(sorted(labels.items())),
        "\n".join(ln.strip(" \t\r") for ln in text[start:end].split("\n")).strip(),
    )


def parse_text(text: str) -> list[ServedModel]:
    """The models of a ``ModelServerConfig`` in text format, each keeping its own text."""
    msg, _ = _parse_block(_tokens(text), 0, None)
    try:
        out = [
            _entry(c, text)
            for lst in msg.get("model_config_list", [])
            for c in lst.get("config", [])
        ]
    except ValueError as e:  # a non-integer version or label value
        raise ValidationError("model config", "integer versions", str(e)) from None
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ValidationError("model config", "unique model names", names)
    return out


def _fields_text(m: ServedModel) -> str:
    parts = [
        f"name: {_quote(m.name)}",
        f"base_path: {_quote(m.base_path)}",
        f"model_platform: {_quote(m.platform)}",
    ]
    if m.versions is not None:
        vs = " ".join(f"versions: {v}" for v in m.versions)
        parts.append(f"model_version_policy {{ specific {{ {vs} }} }}")
    elif m.all_versions:
        parts.append("model_version_policy { all {} }")
    elif m.latest is not None:
        parts.append(f"model_version_policy {{ latest {{ num_versions: {m.latest} }} }}")
    for label, v in m.labels:
        parts.append(f"version_labels {{ key: {_quote(label)} value: {v} }}")
    return "\n".join(parts)


def entry_text(m: ServedModel) -> str:
    """The entry's text inside ``config { }``: the operator's own, or built from the fields."""
    return m.text if m.text is not None else _fields_text(m)


def format_text(models: Sequence[ServedModel]) -> str:
    """The text form of a model set (what ``--model_config_file`` holds)."""
    lines = ["model_config_list {"]
    for m in models:
        lines.append("  config {")
        lines.extend(
            "    " + ln for ln in entry_text(m).split("\n")
        )  # not splitlines(): a string may hold U+2028
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


_ESC = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _quote(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESC:
            out.append(_ESC[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):03o}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def to_proto(models: Sequence[ServedModel], st: Any) -> Any:
    """A ``ModelServerConfig`` message (``st``: the stubs) holding exactly ``models``; an
    entry with its own text is parsed from that text by protobuf, field for field."""
    from google.protobuf import text_format

    cfg = st.model_server_config_pb2.ModelServerConfig()
    lst = cfg.model_config_list
    for m in models:
        c = lst.config.add()
        try:
            text_format.Parse(entry_text(m), c)
        except text_format.ParseError as e:
            raise ValidationError(
                f"model config entry {m.name!r}", "a valid ModelConfig in text format", str(e)
            ) from None
    return cfg


def from_proto(cfg: Any) -> list[ServedModel]:
    """The models of a ``ModelServerConfig`` message, each keeping its whole entry as text."""
    from google.protobuf import text_format

    out = []
    for c in cfg.model_config_list.config:
        pol = c.model_version_policy
        kind = pol.WhichOneof("policy_choice")
        out.append(
            ServedModel(
                c.name,
                c.base_path,
                c.model_platform or "tensorflow",
                tuple(int(v) for v in pol.specific.versions) if kind == "specific" else None,
                int(pol.latest.num_versions) if kind == "latest" else None,
                kind == "all",
                tuple((str(k), int(v)) for k, v in sorted(c.version_labels.items())),
                text_format.MessageToString(c, as_utf8=True).strip(),
            )
        )
    return out
