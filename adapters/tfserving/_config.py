"""TF Serving's model set: ``ModelServerConfig`` entries, their text form, and the reload rule.

TF Serving's ``ModelService/HandleReloadConfigRequest`` *replaces* the server's whole model
set: a model missing from the new list is unloaded. So the adapter keeps, per server, the set
it knows (``ServedModel`` entries) and always sends all of it, changed or not.

The text form is protobuf text format of ``tensorflow.serving.ModelServerConfig`` as in a
``--model_config_file``::

    model_config_list {
      config { name: "mlp" base_path: "/models/mlp" model_platform: "tensorflow" }
    }

``parse_text`` reads the subset TF Serving deployments use (``name``, ``base_path``,
``model_platform``, ``model_version_policy`` with ``specific { versions: N }``, ``latest``
or ``all``) without needing the generated stubs, so discovery works over REST alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferline.core import ValidationError

__all__ = ["ServedModel", "format_text", "parse_text", "to_proto"]


@dataclass(frozen=True)
class ServedModel:
    """One entry of a server's model set. ``versions``: a ``specific`` version policy
    (None: TF Serving's default, the latest version)."""

    name: str
    base_path: str
    platform: str = "tensorflow"
    versions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError("model name", "a non-empty string", self.name)
        if not isinstance(self.base_path, str) or not self.base_path:
            raise ValidationError(
                f"{self.name}.base_path", "a model directory path", self.base_path
            )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "base_path": self.base_path,
            "platform": self.platform,
        }
        if self.versions is not None:
            d["versions"] = list(self.versions)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ServedModel:
        v = d.get("versions")
        return cls(
            str(d.get("name", "")),
            str(d.get("base_path", "")),
            str(d.get("platform", "tensorflow")),
            None if v is None else tuple(int(x) for x in v),
        )


_TOKEN = re.compile(
    r'\s*(?:(#[^\n]*)|([A-Za-z_][\w.]*)|("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')|(-?\d+)|([{}:<>]))'
)


def _tokens(text: str) -> list[str]:
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
        out.append(next(g for g in m.groups()[1:] if g is not None))
    return out


def _parse_block(toks: list[str], i: int, end: str | None) -> tuple[dict[str, list[Any]], int]:
    msg: dict[str, list[Any]] = {}
    while i < len(toks):
        t = toks[i]
        if t == end:
            return msg, i + 1
        if not re.match(r"[A-Za-z_]", t):
            raise ValidationError("model config", "a field name", t)
        i += 1
        if i < len(toks) and toks[i] == ":":
            i += 1
        if i < len(toks) and toks[i] in "{<":
            close = "}" if toks[i] == "{" else ">"
            sub, i = _parse_block(toks, i + 1, close)
            msg.setdefault(t, []).append(sub)
        elif i < len(toks):
            v = toks[i]
            msg.setdefault(t, []).append(
                bytes(v[1:-1], "utf-8").decode("unicode_escape") if v[0] in "\"'" else v
            )
            i += 1
    if end is not None:
        raise ValidationError("model config", f"a closing {end!r}", "end of text")
    return msg, i


def parse_text(text: str) -> list[ServedModel]:
    """The models of a ``ModelServerConfig`` in text format."""
    msg, _ = _parse_block(_tokens(text), 0, None)
    out = []
    for lst in msg.get("model_config_list", []):
        for c in lst.get("config", []):
            versions = None
            for pol in c.get("model_version_policy", []):
                if "specific" in pol:
                    versions = tuple(int(v) for s in pol["specific"] for v in s.get("versions", []))
            out.append(
                ServedModel(
                    str(c.get("name", [""])[0]),
                    str(c.get("base_path", [""])[0]),
                    str(c.get("model_platform", ["tensorflow"])[0]),
                    versions,
                )
            )
    names = [m.name for m in out]
    if len(set(names)) != len(names):
        raise ValidationError("model config", "unique model names", names)
    return out


def format_text(models: Sequence[ServedModel]) -> str:
    """The text form of a model set (what ``--model_config_file`` holds)."""
    lines = ["model_config_list {"]
    for m in models:
        lines.append("  config {")
        lines.append(f"    name: {_quote(m.name)}")
        lines.append(f"    base_path: {_quote(m.base_path)}")
        lines.append(f"    model_platform: {_quote(m.platform)}")
        if m.versions is not None:
            vs = " ".join(f"versions: {v}" for v in m.versions)
            lines.append(f"    model_version_policy {{ specific {{ {vs} }} }}")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_proto(models: Sequence[ServedModel], st: Any) -> Any:
    """A ``ModelServerConfig`` message (``st``: the stubs) holding exactly ``models``."""
    cfg = st.model_server_config_pb2.ModelServerConfig()
    lst = cfg.model_config_list
    for m in models:
        c = lst.config.add()
        c.name = m.name
        c.base_path = m.base_path
        c.model_platform = m.platform
        if m.versions is not None:
            c.model_version_policy.specific.versions.extend(m.versions)
    return cfg


def from_proto(cfg: Any) -> list[ServedModel]:
    """The models of a ``ModelServerConfig`` message."""
    out = []
    for c in cfg.model_config_list.config:
        pol = c.model_version_policy
        versions = (
            tuple(int(v) for v in pol.specific.versions) if pol.HasField("specific") else None
        )
        out.append(ServedModel(c.name, c.base_path, c.model_platform or "tensorflow", versions))
    return out
