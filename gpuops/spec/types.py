"""Field types of fleet.yaml: each checks its value and says what is wrong and how to write it.

Names that end up on a command line (hosts, users, paths on the node) are held to character
sets that can never be read as an ssh option or a shell word: no whitespace, no shell
metacharacters, never a leading '-'.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from typing import Annotated, Any, Callable, Literal, Sequence
from urllib.parse import urlsplit

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from gpuops.core.units import UnitError, format_duration, parse_duration
from gpuops.spec.errors import FieldProblem, show
from gpuops.spec.selectors import MAX_GPU_INDEX, SelectorError, parse_gpu_indices

SPEC_VERSION = 1

_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}\Z){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?\Z")
USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\Z")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")
_LABEL_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*"
LABEL_KEY_RE = re.compile(rf"^(?:(?=[^/]{{1,253}}/){_DNS_SUBDOMAIN}/)?{_LABEL_NAME}\Z")
LABEL_VALUE_RE = re.compile(rf"^(?:{_LABEL_NAME})?\Z")
COMMAND_RE = re.compile(r"^(?:[A-Za-z0-9_][A-Za-z0-9_.+-]*|(?:/[A-Za-z0-9_.+-]+)+)\Z")
REMOTE_PATH_RE = re.compile(r"^[A-Za-z0-9_./+@=,][A-Za-z0-9_./+@=,-]*\Z")
_SHELL_CHARS = set("`$;|&<>()'\"\\*?!{}[]#~")

MAX_PATH = 4096
_TEMPLATE_MARKS = ("{{", "{%", "{#")  # Jinja's openers, which Ansible templates
MAX_TEXT = 500


def closest(word: str, choices: Sequence[str]) -> str:
    """The 'did you mean' hint, or ''."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else ""


def _string(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        raise FieldProblem(
            f"expected {what} (got {show(value)})", f'quote it if you mean the text: "{show(value)}"'
        )
    raise FieldProblem(f"expected {what} (got {show(value)})")


def _word_problems(text: str, what: str) -> None:
    """Raise for the mistakes that would let a value be read as an option or several words."""
    if not text:
        raise FieldProblem(f"{what} is empty")
    if text.startswith("-"):
        raise FieldProblem(f"{what} must not start with '-' (got {show(text)})")
    if any(c.isspace() for c in text):
        raise FieldProblem(f"{what} must not contain whitespace (got {show(text)})")
    if any(not c.isprintable() for c in text):
        raise FieldProblem(f"{what} must not contain control characters (got {show(text)})")


def check_host(value: Any) -> str:
    text = _string(value, "a host name or IP address")
    _word_problems(text, "host")
    if text.startswith("[") and text.endswith("]"):
        raise FieldProblem(f"write IPv6 addresses without brackets (got {show(text)})", "e.g. host: fd00::11")
    if "@" in text:
        raise FieldProblem(f"host must not contain '@' (got {show(text)})", "put the user in user:")
    if ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            if re.match(r"^[^:]+:\d+$", text):
                raise FieldProblem(
                    f"host must not contain a port (got {show(text)})", "put it in port:"
                ) from None
            raise FieldProblem(f"not a valid IPv6 address (got {show(text)})") from None
        return text
    if re.fullmatch(r"[0-9.]+", text):
        try:
            ipaddress.IPv4Address(text)
        except ValueError:
            raise FieldProblem(f"not a valid IPv4 address (got {show(text)})") from None
        return text
    if bad := sorted({c for c in text if c in _SHELL_CHARS}):
        raise FieldProblem(
            f"host must not contain {' '.join(repr(c) for c in bad)} (got {show(text)})",
            "a host is a DNS name, an ~/.ssh/config Host alias or an IP address",
        )
    if not HOSTNAME_RE.match(text):
        raise FieldProblem(
            f"not a valid host name (got {show(text)})",
            "use letters, digits, '-', '_' and '.', at most 63 characters between dots",
        )
    return text


def check_user(value: Any, what: str = "user name") -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        raise FieldProblem(f"expected a {what} (got {value})", "names, not numeric ids")
    text = _string(value, f"a {what}")
    _word_problems(text, what)
    if not USER_RE.match(text):
        raise FieldProblem(
            f"not a valid {what} (got {show(text)})",
            "start with a letter or '_', then letters, digits, '_', '.' or '-'; at most 32 characters",
        )
    return text


def check_group(value: Any) -> str:
    return check_user(value, "group name")


def _name_checker(what: str, reserved: Sequence[str] = ()) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        text = _string(value, f"a {what}")
        _word_problems(text, what)
        if not NAME_RE.match(text):
            raise FieldProblem(
                f"not a valid {what} (got {show(text)})",
                "start with a letter or digit, then letters, digits, '_', '.' or '-'; at most 63 characters",
            )
        if text in reserved:
            raise FieldProblem(f"{show(text)} is reserved and cannot be a {what}")
        return text

    return check


check_node_name = _name_checker("node name")
check_team_name = _name_checker("team name")
check_pool_name = _name_checker("pool name")
check_jump_name = _name_checker("jump host name", reserved=("none",))


def check_port(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem(f"expected a port number (got {show(value)})")
    if not 1 <= value <= 65535:
        raise FieldProblem(f"must be between 1 and 65535 (got {value})")
    return value


def _count_checker(low: int, high: int) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise FieldProblem(f"expected a whole number (got {show(value)})")
        if not low <= value <= high:
            raise FieldProblem(f"must be between {low} and {high} (got {value})")
        return value

    return check


def _duration_checker(low: float, high: float, zero_ok: bool = False) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise FieldProblem(f"expected a duration such as 10s (got {show(value)})")
        try:
            seconds = parse_duration(value)
        except (UnitError, OverflowError, ValueError):
            raise FieldProblem(
                f"expected a duration such as 500ms, 10s, 5m or 1h (got {show(value)})",
                "a bare number is seconds",
            ) from None
        if zero_ok and seconds == 0:
            return 0.0
        if not (math.isfinite(seconds) and low <= seconds <= high):
            zero = "0 (off) or " if zero_ok else ""
            span = f"{format_duration(low)} and {format_duration(high)}"
            raise FieldProblem(f"must be {zero}between {span} (got {show(value)})")
        return seconds

    return check


def _choice_checker(choices: Sequence[str], refused: dict[str, str] | None = None) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        key = value if isinstance(value, str) else show(value).strip("'")
        if refused and key.lower() in refused:
            raise FieldProblem(refused[key.lower()])
        if isinstance(value, str) and value in choices:
            return value
        options = " | ".join(choices)
        raise FieldProblem(f"must be one of {options} (got {show(value)})", closest(key, choices))

    return check


def check_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "no", "off"):
        return False
    raise FieldProblem(f"expected true or false (got {show(value)})")


def check_local_path(value: Any) -> str:
    text = _string(value, "a file path")
    if not text:
        raise FieldProblem("path is empty")
    if text.startswith("-"):
        raise FieldProblem(f"path must not start with '-' (got {show(text)})", "write ./" + text)
    if any(not c.isprintable() for c in text) or len(text) > MAX_PATH:
        raise FieldProblem(f"not a usable file path (got {show(text)})")
    if any(mark in text for mark in _TEMPLATE_MARKS):
        # gpuops writes these paths into Ansible inventories, and Ansible would run a template.
        raise FieldProblem(
            f"a file path must not hold template syntax ({{{{, {{% or {{#}}) (got {show(text)})",
            "gpuops inventory passes paths to Ansible, which would run it as a template",
        )
    return text


def check_command(value: Any) -> str:
    text = _string(value, "a command name or absolute path")
    _word_problems(text, "command")
    if not COMMAND_RE.match(text) or len(text) > MAX_PATH:
        raise FieldProblem(
            f"not a usable command (got {show(text)})",
            "a command name found on the node's PATH (python3) or an absolute path (/usr/bin/python3), "
            "without arguments",
        )
    return text


_USERINFO_RE = re.compile(r"^(\s*[A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)@")


def redact_url(text: str) -> str:
    """`text` with a URL's password (`user:***@`) or lone user-info token (`***@`) hidden: what a
    message, title or JSON document may show of a URL the operator gave."""

    def hide(match: re.Match[str]) -> str:
        user, colon, _secret = match.group(2).partition(":")
        return match.group(1) + (f"{user}:***@" if colon else "***@")

    return _USERINFO_RE.sub(hide, text, count=1)


def parse_prometheus_url(text: str) -> str:
    """A Prometheus API's base URL (`http://host:port[/prefix]`, without the trailing slash);
    ValueError saying what is wrong. A query string or fragment is refused: it would be dropped."""
    raw = text.strip()
    text = redact_url(text)  # what the messages show
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: give an http:// or https:// URL, e.g. http://127.0.0.1:9090")
    if not parts.hostname:
        raise ValueError(f"{text!r}: the URL names no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a Prometheus URL has no query string or fragment")
    if port == 0:
        raise ValueError(f"{text!r}: port 0 is not a port to connect to")
    return raw.rstrip("/")


def check_prometheus_url(value: Any) -> str:
    text = _string(value, "a URL such as http://prometheus.example.com:9090")
    try:
        return parse_prometheus_url(text)
    except ValueError as exc:
        raise FieldProblem(str(exc), "the base URL of Prometheus' HTTP API (Thanos, Mimir: theirs)") from None


_SELECTOR_RE = re.compile(
    r"""^\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*"""
    r"""(,\s*[A-Za-z_][A-Za-z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*)*\Z"""
)


def check_label_matchers(value: Any) -> str:
    text = _string(value, 'label matchers such as job="gpuops"')
    if not _SELECTOR_RE.match(text) or len(text) > MAX_TEXT:
        raise FieldProblem(
            f"not PromQL label matchers (got {show(text)})",
            'matchers without braces, comma separated: job="gpuops", cluster=~"eu-.*"',
        )
    return text.strip()


def check_remote_path(value: Any) -> str:
    text = _string(value, "a path on the node")
    _word_problems(text, "path")
    if not REMOTE_PATH_RE.match(text) or len(text) > MAX_PATH:
        raise FieldProblem(
            f"not a usable path on the node (got {show(text)})",
            "use letters, digits and _ . / + @ = , - only; no '~' (write the path in full)",
        )
    return text


def check_backend(value: Any) -> str:
    text = _string(value, "a backend name")
    if not re.match(r"^[a-z][a-z0-9_-]{0,31}$", text):
        raise FieldProblem(f"not a valid backend name (got {show(text)})", "built in: nvml, sim")
    return text


def check_label_key(value: Any) -> str:
    text = _string(value, "a label name")
    if not LABEL_KEY_RE.match(text):
        raise FieldProblem(
            f"not a valid label name (got {show(text)})",
            "as Kubernetes: [prefix/]name, name up to 63 letters, digits, '-', '_', '.', starting and ending "
            "with a letter or digit",
        )
    return text


def check_label_value(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, "a label value")
    if not LABEL_VALUE_RE.match(text):
        raise FieldProblem(
            f"not a valid label value (got {show(text)})",
            "up to 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit",
        )
    return text


def check_text(value: Any) -> str:
    text = _string(value, "text")
    if len(text) > MAX_TEXT or any(not c.isprintable() for c in text):
        raise FieldProblem(f"must be one line of at most {MAX_TEXT} printable characters")
    return text


def check_version(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem(
            f"expected the number {SPEC_VERSION} (got {show(value)})", f"write version: {SPEC_VERSION}"
        )
    if value != SPEC_VERSION:
        raise FieldProblem(f"unsupported version {value}; this gpuops reads version {SPEC_VERSION}")
    return value


def check_gpu_key(value: Any) -> str:
    """A GPU index set written as a key: 0, "0-3", "4,5", "0-1,6"."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, "GPU indices")
    try:
        parse_gpu_indices(text)
    except SelectorError as exc:
        raise FieldProblem(str(exc), f"GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to {MAX_GPU_INDEX})") from None
    return text


def check_jump_ref(value: Any) -> str:
    """A jump_hosts name, 'none' (connect directly) or [user@]host:port / user@host[:port]."""
    text = _string(value, "a jump host")
    _word_problems(text, "jump_host")
    if text == "none" or NAME_RE.match(text):
        return text  # a name: checked against jump_hosts once the whole file is read
    parse_jump_literal(text)
    return text


def parse_jump_literal(text: str) -> tuple[str | None, str, int | None]:
    """'ops@bastion:2222' -> ('ops', 'bastion', 2222); '[fd00::1]:22' -> (None, 'fd00::1', 22)."""
    user: str | None = None
    rest = text
    if "@" in rest:
        user_text, _, rest = rest.rpartition("@")
        user = check_user(user_text)
    port: int | None = None
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise FieldProblem(f"not a valid jump host (got {show(text)})", "write [IPv6]:port")
        if tail:
            port = check_port(tail[1:])
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = check_port(port_text)
    else:
        host = rest
    return user, check_host(host), port


_NAME_SCHEMA = {"type": "string", "pattern": NAME_RE.pattern}

Host = Annotated[
    str,
    BeforeValidator(check_host),
    WithJsonSchema({"type": "string", "description": "DNS name, ~/.ssh/config Host alias or IP address"}),
]
UserName = Annotated[
    str, BeforeValidator(check_user), WithJsonSchema({"type": "string", "pattern": USER_RE.pattern})
]
GroupName = Annotated[
    str, BeforeValidator(check_group), WithJsonSchema({"type": "string", "pattern": USER_RE.pattern})
]
NodeName = Annotated[str, BeforeValidator(check_node_name), WithJsonSchema(_NAME_SCHEMA)]
TeamName = Annotated[str, BeforeValidator(check_team_name), WithJsonSchema(_NAME_SCHEMA)]
PoolName = Annotated[str, BeforeValidator(check_pool_name), WithJsonSchema(_NAME_SCHEMA)]
JumpName = Annotated[str, BeforeValidator(check_jump_name), WithJsonSchema(_NAME_SCHEMA)]
JumpRef = Annotated[
    str,
    BeforeValidator(check_jump_ref),
    WithJsonSchema({"type": "string", "description": "a name from jump_hosts, user@host:port, or none"}),
]
Port = Annotated[
    int, BeforeValidator(check_port), WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 65535})
]
Flag = Annotated[bool, BeforeValidator(check_flag), WithJsonSchema({"type": "boolean"})]
LocalPath = Annotated[str, BeforeValidator(check_local_path), WithJsonSchema({"type": "string"})]
RemotePath = Annotated[
    str,
    BeforeValidator(check_remote_path),
    WithJsonSchema({"type": "string", "pattern": REMOTE_PATH_RE.pattern}),
]
Command = Annotated[str, BeforeValidator(check_command), WithJsonSchema({"type": "string"})]
PrometheusUrl = Annotated[
    str, BeforeValidator(check_prometheus_url), WithJsonSchema({"type": "string", "format": "uri"})
]
LabelMatchers = Annotated[str, BeforeValidator(check_label_matchers), WithJsonSchema({"type": "string"})]
BackendName = Annotated[
    str,
    BeforeValidator(check_backend),
    WithJsonSchema({"type": "string", "examples": ["nvml", "sim"], "pattern": "^[a-z][a-z0-9_-]{0,31}$"}),
]
LabelKey = Annotated[str, BeforeValidator(check_label_key), WithJsonSchema({"type": "string"})]
LabelValue = Annotated[
    str, BeforeValidator(check_label_value), WithJsonSchema({"type": ["string", "integer"]})
]
Text = Annotated[str, BeforeValidator(check_text), WithJsonSchema({"type": "string", "maxLength": MAX_TEXT})]
Version = Annotated[int, BeforeValidator(check_version), WithJsonSchema({"const": SPEC_VERSION})]
GpuKey = Annotated[
    str,
    BeforeValidator(check_gpu_key),
    WithJsonSchema({"type": "string", "pattern": r"^\s*\d+(\s*-\s*\d+)?(\s*,\s*\d+(\s*-\s*\d+)?)*\s*$"}),
]

HOST_KEY_POLICIES = ("strict", "accept-new")
HostKeyPolicy = Literal["strict", "accept-new"]
AGENT_MODES = ("auto", "installed", "push")
AgentMode = Literal["auto", "installed", "push"]

_NO_OFF = (
    "host key checking cannot be turned off; use accept-new to trust a new host on first contact, "
    "or add its key with ssh-keyscan"
)
HostKeyPolicyField = Annotated[
    HostKeyPolicy,
    BeforeValidator(
        _choice_checker(
            HOST_KEY_POLICIES,
            {
                k: _NO_OFF
                for k in ("off", "no", "none", "false", "insecure", "ignore", "accept-all", "disabled")
            },
        )
    ),
]
AgentModeField = Annotated[AgentMode, BeforeValidator(_choice_checker(AGENT_MODES))]


_DURATION_OUT = PlainSerializer(lambda v: format_exact_duration(v), return_type=Any, when_used="json")


def _duration_schema(low: float, high: float, zero_ok: bool = False) -> WithJsonSchema:
    return WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d|w)\s*)+$"},
                {"type": "number", "minimum": 0},
            ],
            "description": f"a duration: 500ms, 10s, 5m, 1h; from {format_duration(low)} to "
            f"{format_duration(high)}{', or 0 for off' if zero_ok else ''}",
        }
    )


def format_exact_duration(seconds: float) -> str | float:
    """A duration text that reads back as exactly `seconds`: 15.0 -> '15s', 90061.0 -> '1d1h1m1s',
    0.25 -> '250ms'; a number when no such text exists."""
    if seconds == 0:
        return "0s"
    if seconds.is_integer():
        remaining = int(seconds)
        parts = []
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if remaining >= size:
                parts.append(f"{remaining // size}{unit}")
                remaining %= size
        text = "".join(parts)
    else:
        millis = round(seconds * 1000)
        text = f"{millis}ms"
    try:
        if parse_duration(text) == seconds:
            return text
    except UnitError:
        pass
    return seconds


Timeout = Annotated[
    float, BeforeValidator(_duration_checker(0.1, 600.0)), _DURATION_OUT, _duration_schema(0.1, 600.0)
]
KeepaliveInterval = Annotated[
    float,
    BeforeValidator(_duration_checker(1.0, 3600.0, zero_ok=True)),
    _DURATION_OUT,
    _duration_schema(1.0, 3600.0, zero_ok=True),
]
Interval = Annotated[
    float, BeforeValidator(_duration_checker(0.1, 3600.0)), _DURATION_OUT, _duration_schema(0.1, 3600.0)
]
HandshakeCount = Annotated[
    int,
    BeforeValidator(_count_checker(1, 4096)),
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": 4096}),
]
