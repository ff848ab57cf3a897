"""PyYAML for ``bridge.config``: reading a YAML file (noting each key given twice), and where each
configuration problem is in it: its line, and the "quote it" hint where YAML typed a plain value
the key wanted as text. ``bridge.config`` imports this only for a file that is not plain JSON or
that has problems, so a good JSON file is read without PyYAML (bench case 6)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from compat.settings import snake_case


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that notes each key given twice in one mapping: YAML says keys are
    unique, and PyYAML keeps the last value without a word."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.repeated: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[str, int] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value != "<<":
                line = key.start_mark.line + 1
                if key.value in first:
                    self.repeated.append(
                        f"line {line}: {key.value} is given again (first on line {first[key.value]}); "
                        "the last value is used"
                    )
                else:
                    first[key.value] = line
        return super().construct_mapping(node, deep)


def load_yaml(stream: Any) -> tuple[Any, list[str]]:
    """The document in ``stream`` (``yaml.safe_load``'s value) and a warning for each key given
    twice in one mapping (``line N: <key> is given again (first on line M); the last value is
    used``).

    Raises:
        yaml.YAMLError: not YAML.
    """
    loader = _Loader(stream)
    try:
        return loader.get_single_data(), loader.repeated
    finally:
        loader.dispose()


_WRONG = re.compile(r"Expected `(?P<want>[^`]+)`, got `(?P<got>bool|int|float|date|datetime)`")
_YAML_KINDS = {
    "tag:yaml.org,2002:bool": "a boolean",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:timestamp": "a date",
}


def _compose(text: str) -> yaml.Node | None:
    """The YAML node tree of ``text``. JSON may indent with tabs where YAML may not: a JSON
    file's tabs can only be whitespace (a tab in a JSON string is escaped), so they are read as
    spaces, which keeps every line where it is."""
    try:
        return yaml.compose(text)
    except yaml.YAMLError:
        if "\t" not in text:
            raise
        return yaml.compose(text.replace("\t", " "))


def locate_lines(problems: list[str], file: Path) -> list[str]:
    """Each ``<key path>: <message>`` as ``:<line>: <key path>: <message>`` where the key is found
    in ``file`` (read again: only a file with problems is), with the "quote it" hint where YAML
    typed a plain value the key wanted as text; in the file's order."""
    try:
        root = _compose(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        root = None
    out: list[tuple[int, str]] = []
    for line in problems:
        loc, _, msg = line.partition(": ")
        key, value = _node_at(root, loc.split(".")) if root is not None and loc else (None, None)
        node = value if value is not None else key
        hint = ""
        if isinstance(value, yaml.ScalarNode) and value.style is None and _WRONG.search(msg):
            kind = _YAML_KINDS.get(value.tag)
            if kind:
                hint = f' (YAML reads {value.value} as {kind}; quote it: "{value.value}")'
        elif msg.startswith("key ") and isinstance(value, yaml.MappingNode):  # a key that is not a string
            typed = next((k for k, _ in value.value if k.tag in _YAML_KINDS and k.style is None), None)
            if isinstance(typed, yaml.ScalarNode):
                node = typed
                hint = f' (YAML reads {typed.value} as {_YAML_KINDS[typed.tag]}; quote it: "{typed.value}")'
        number = node.start_mark.line + 1 if node is not None else 0
        out.append((number, f":{number}: {line}{hint}" if number else f": {line}{hint}"))
    return [line for _, line in sorted(out, key=lambda item: item[0])]  # in the file's order


def _node_at(root: yaml.Node, keys: list[str]) -> tuple[yaml.Node | None, yaml.Node | None]:
    """The key node and the value node at ``keys`` (camelCase or snake_case, list indices as
    digits); ``(None, None)`` where the path leaves the document."""
    key_node: yaml.Node | None = None
    node: yaml.Node | None = root
    for key in keys:
        if isinstance(node, yaml.MappingNode):
            match = next(
                ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value in (key, snake_case(key))),
                None,
            )
            if match is None:  # a key YAML read as another type (no: → False) is named by its value
                match = next(((k, v) for k, v in node.value if str(_scalar(k)) == key), None)
            if match is None:
                return key_node, None if key_node is None else node
            key_node, node = match
        elif isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            node = node.value[int(key)]
        else:
            return key_node, node
    return key_node, node


def _scalar(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        return yaml.safe_load(node.value) if node.style is None else node.value
    except yaml.YAMLError:
        return node.value
