"""The documentation against the repository: links, anchors, named paths and the CLI's commands.

The docs are README.md, CONTRIBUTING.md, docs/*.md and the READMEs beside the code. A link
must name a file inside the repository (a clone has nothing outside it) and, with an anchor,
a heading of that file; a repository path a doc names (`deamoe_trt/...`, `tests/...`, ...)
must exist; docs/usage.md must have a row for every command the CLI registers, read from
the parser at run time so a new command fails here until it is documented.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from deamoe_trt.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *(ROOT / "docs").glob("*.md"),
        ROOT / "samples" / "README.md",
        ROOT / "export-recipes" / "README.md",
        ROOT / "plugins" / "deamoe" / "README.md",
        ROOT / "native" / "cuda" / "KERNELS.md",
    }
)

# Top-level folders whose paths the docs name from the repository root.
TOP_LEVEL = ("deamoe_trt", "docs", "tests", "scripts", "samples", "native", "plugins", "export-recipes", ".ci")
_PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP_LEVEL) + r")/[\w./-]*)")
# Words that stand for a name the reader chooses (`deamoe_trt/runtimes/NAME.py`).
_PLACEHOLDERS = re.compile(r"(?<![A-Za-z])(NAME|OUT|DIR|FILE|PATH|CKPT|LM)(?![A-Za-z])")
# A path right after one of these is what a command writes, not something that must exist.
_OUTPUT_FLAGS = ("-o", "--out", "--output", "--plot", "--json", ">")
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^\s*(```|~~~)")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_and_code(text: str) -> tuple[list[str], list[str]]:
    """The lines outside fenced code blocks, and those inside them."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        (code if fenced else prose).append(line)
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = prose_and_code(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for line in prose:
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(text: str) -> list[str]:
    prose, _ = prose_and_code(text)
    return [m.group(1) for line in prose for m in _LINK.finditer(line)]


def local_links(text: str) -> list[str]:
    return [t for t in links(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def repo_paths(text: str) -> list[str]:
    """Repository paths a doc names, placeholders (`tests/<area>`, `export-recipes/*.toml`) and
    the outputs of commands (`-o docs/x.png`) left out."""
    out = []
    for line in text.splitlines():
        for m in _PATH.finditer(line):
            path = m.group(1).rstrip(".,:;")
            after = line[m.end() :]
            if after[:1] in ("<", "{", "*", "$", "[") or "..." in path or _PLACEHOLDERS.search(path):
                continue
            before = line[: m.start()].rstrip().rsplit(" ", 1)[-1].strip("`(")
            if before in _OUTPUT_FLAGS:
                continue
            out.append(path)
    return out


def documented_commands(usage: str) -> set[str]:
    return set(re.findall(r"^\|\s*`deamoe-trt ([a-z][a-z0-9-]*)", usage, flags=re.M))


def registered_commands() -> set[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    # Aliases share their command's parser, whose prog ends with the command's own name.
    return {p.prog.split()[-1] for p in sub.choices.values()}


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_links_name_files_inside_the_repository(doc):
    bad = []
    for target in local_links(doc.read_text(encoding="utf-8")):
        file = target.split("#", 1)[0]
        if not file:
            continue
        resolved = (doc.parent / file).resolve()
        if not resolved.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository)")
        elif not resolved.exists():
            bad.append(f"{target} (missing)")
    assert not bad, f"{rel(doc)} links to: {', '.join(bad)}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_link_anchors_name_a_heading_of_their_file(doc):
    bad = []
    for target in local_links(doc.read_text(encoding="utf-8")):
        file, _, anchor = target.partition("#")
        if not anchor:
            continue
        resolved = (doc.parent / file).resolve() if file else doc
        if resolved.suffix == ".md" and resolved.is_file() and anchor not in anchors(resolved):
            bad.append(target)
    assert not bad, f"{rel(doc)} links to headings that do not exist: {', '.join(bad)}"


@pytest.mark.parametrize("doc", DOCS, ids=rel)
def test_repository_paths_named_in_the_docs_exist(doc):
    missing = sorted({p for p in repo_paths(doc.read_text(encoding="utf-8")) if not (ROOT / p).exists()})
    assert not missing, f"{rel(doc)} names paths that do not exist: {', '.join(missing)}"


def test_usage_documents_every_registered_command():
    usage = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    registered = registered_commands()
    assert {"generate", "export-edgellm"} <= registered  # the parser was read, not an empty set
    missing = sorted(registered - documented_commands(usage))
    assert not missing, f"docs/usage.md has no row for: {', '.join(missing)}"
    stale = sorted(documented_commands(usage) - registered)
    assert not stale, f"docs/usage.md documents commands the CLI does not have: {', '.join(stale)}"


def test_readme_links_the_specification_in_the_repository():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/spec.md" in local_links(readme)


# The checks' own parsing, on text whose answer is known.


def test_repo_paths_finds_a_path_in_a_command_and_skips_placeholders_and_outputs():
    text = (
        "run `deamoe-trt quantize samples/models/tiny-lm -o OUT` and `deamoe-trt bench-lm --plot docs/new.png`;\n"
        "see tests/<area>, export-recipes/*.toml, tests/test_NAME.py, tests/cpu/ and deamoe_trt/routing.py.\n"
    )
    assert repo_paths(text) == ["samples/models/tiny-lm", "tests/cpu/", "deamoe_trt/routing.py"]
    assert not (ROOT / "samples/models/tiny-lm").exists()


def test_slug_follows_githubs_anchors():
    assert slug("The layer benchmark: `deamoe-trt bench`") == "the-layer-benchmark-deamoe-trt-bench"
    heading = "The int8/int4 layer benchmark: `bench --quantized`"
    assert slug(heading) == "the-int8int4-layer-benchmark-bench---quantized"
    assert slug("llama.cpp on the same model") == "llamacpp-on-the-same-model"


def test_links_skip_code_blocks_and_urls_and_catch_a_link_outside_the_repository():
    text = "[spec](../shared/deamoe-spec.md), [site](https://example.com)\n```\n[no](missing.md)\n```\n"
    assert local_links(text) == ["../shared/deamoe-spec.md"]
    assert not (ROOT / "README.md").parent.joinpath("../shared/deamoe-spec.md").resolve().is_relative_to(ROOT)
