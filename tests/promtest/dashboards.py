"""What the Grafana dashboards and the Prometheus rules ask of the exporters, read from the files.

* :func:`dashboard_queries` -> every panel's PromQL (rows' nested panels included), and
  :func:`variable_queries` -> the templating variables' ``label_values(...)`` queries;
* :func:`concrete` -> a panel query with Grafana's variables replaced, ready for Prometheus' API
  (``$node`` -> ``.*`` as "All" does, ``$__rate_interval`` -> a range);
* :func:`rule_exprs`, :func:`recording_rules` -> the rules file's expressions and recorded names;
* :func:`documented_metrics` -> the metric names of docs/metrics.md's table;
* :func:`metric_names` -> the metric names a PromQL expression reads.

The exporters' tests evaluate :func:`dashboard_queries` against a Prometheus scraping the
simulated fleet; the dashboard tests check with :func:`metric_names` that every name is documented
or recorded, so the dashboards, the rules and the vocabulary cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
GRAFANA_DIR = REPO / "deploy" / "grafana"
RULES_FILE = REPO / "deploy" / "prometheus" / "gpuops.rules.yml"
# promtool evaluates a file at one interval: the tests over days are in a file of their own.
RULES_TESTS_FILES = (
    REPO / "deploy" / "prometheus" / "gpuops.rules.test.yml",
    REPO / "deploy" / "prometheus" / "gpuops.rules.days.test.yml",
)
METRICS_DOC = REPO / "docs" / "metrics.md"
# Series Prometheus makes itself for every target: usable by rules and panels without a doc entry.
PROMETHEUS_OWN = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def where(self) -> str:
        return f"{self.dashboard}: panel {self.panel!r} query {self.ref_id}"


def dashboard_files() -> list[Path]:
    return sorted(GRAFANA_DIR.glob("*.json"))


def load_dashboard(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a dashboard is a JSON object")
    return doc


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside (collapsed) rows too."""
    stack = list(reversed(dashboard.get("panels", [])))
    while stack:
        panel = stack.pop()
        yield panel
        stack.extend(reversed(panel.get("panels", [])))


def dashboard_queries(path: Path) -> list[PanelQuery]:
    """Every PromQL expression of the dashboard's panels, in panel order."""
    doc = load_dashboard(path)
    found: list[PanelQuery] = []
    for panel in panels(doc):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if isinstance(expr, str):
                title = str(panel.get("title", ""))
                found.append(PanelQuery(path.name, title, str(target.get("refId")), expr))
    return found


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


_LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<expr>.*),)?\s*(?P<label>[A-Za-z_]\w*)\s*\)\s*$", re.S)


def variable_queries(path: Path) -> list[PanelQuery]:
    """The series selectors of the query variables' ``label_values(SELECTOR, label)``."""
    found: list[PanelQuery] = []
    for var in variables(load_dashboard(path)):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        match = _LABEL_VALUES.match(str(text or ""))
        if match is None:
            raise ValueError(f"{path.name}: variable {var.get('name')}: not label_values(...): {text!r}")
        if match.group("expr"):
            found.append(PanelQuery(path.name, f"${var.get('name')}", "variable", match.group("expr")))
    return found


# Grafana's built-in range variables and the values a test uses for them.
_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h", "__range_s": "3600"}
_GRAFANA_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def concrete(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with Grafana variables replaced: ``values`` first, built-in ranges, else ``.*``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        if values and name in values:
            return values[name]
        return _BUILTINS.get(name, ".*")

    return _GRAFANA_VAR.sub(replace, expr)


# --------------------------------------------------------------------------- PromQL names

_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless"}
    | {"atan2", "inf", "nan", "start", "end"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d[\w.]*|\.\d[\w.]*)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_COMMENT = re.compile(r"#[^\n]*")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: identifiers that are not functions, keywords or labels.

    ``{__name__="..."}`` selectors are not followed; the dashboards and rules do not use them.
    """
    text = _STRING.sub('""', expr)
    text = _COMMENT.sub("", text)
    text = _GRAFANA_VAR.sub("1m", text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub("", text)
    text = _NUMBER.sub("", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("("):  # a function or an aggregation
            continue
        if match.group(0).lower() in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names


# --------------------------------------------------------------------------- rules and the doc


def load_yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as handle:
        return YAML(typ="safe", pure=True).load(handle)


@dataclass(frozen=True)
class RuleExpr:
    group: str
    name: str  # the recorded series or the alert
    kind: str  # "record" or "alert"
    expr: str

    def where(self) -> str:
        return f"{RULES_FILE.name}: group {self.group} {self.kind} {self.name}"


def rule_exprs(path: Path = RULES_FILE) -> list[RuleExpr]:
    doc = load_yaml(path)
    found: list[RuleExpr] = []
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            kind = "record" if "record" in rule else "alert"
            found.append(RuleExpr(str(group.get("name")), str(rule[kind]), kind, str(rule["expr"])))
    return found


def recording_rules(path: Path = RULES_FILE) -> set[str]:
    return {rule.name for rule in rule_exprs(path) if rule.kind == "record"}


_TABLE_ROW = re.compile(r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|")


def documented_metrics(path: Path = METRICS_DOC) -> set[str]:
    """The names in the first column of the doc's table(s) whose header's first cell is ``metric``."""
    names: set[str] = set()
    in_table = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells and cells[0] == "metric":
            in_table = True
            continue
        if in_table:
            match = _TABLE_ROW.match(line)
            if match is not None:
                names.add(match.group("name"))
    return names


def undefined_names(exprs: list[tuple[str, str]], known: set[str]) -> list[str]:
    """``where: name`` for each metric name an expression reads that is not in ``known``."""
    return [f"{where}: {name}" for where, expr in exprs for name in sorted(metric_names(expr) - known)]
