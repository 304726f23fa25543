"""The docs cannot rot: README.md and docs/*.md are checked against the code.

- Every ```python block runs: each page in one subprocess, its blocks in order sharing one
  namespace, in a temporary directory. A block may be skipped only with a visible reason in
  the markdown, on the line right before it: `<!-- docs-test: skip: needs two GPUs -->`.
  A page whose code reads RADIXFLOW_URL gets the session's shared server (and its API key).
- Every `--flag` the docs show exists: flags on a line that runs a script of this repository
  (`python benchmarks/serving.py --request-rate 4`, or a prose sentence that names it) in
  that script's --help; other flags in `radixflow serve --help`, except on lines of other
  tools (pip, pytest, make, git, curl).
- Every relative link resolves to a file or folder inside the repository, and its #anchor to
  a heading of that page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip:\s*(\S.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")
SCRIPT = re.compile(r"\b((?:benchmarks|examples)/[\w/]+\.py|sglang_router\.launch_router)\b")
MODULES = {"sglang_router.launch_router"}  # other programs whose flags the docs show (python -m NAME --help)
OTHER_TOOL = re.compile(r"^\s*(?:\$\s*)?(?:pip|python3? -m pip|pytest|python3? -m pytest|make|git|curl)\b")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
PAGE_TIMEOUT_S = 900  # generous: CI shares 2 cores; a page takes well under a minute alone


@dataclass
class Block:
    lang: str
    line: int  # 1-based line of the first code line
    code: str
    skip_reason: str | None


def blocks(path: Path) -> list[Block]:
    out, lines = [], path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i + 1
        j = start
        while j < len(lines) and not FENCE.match(lines[j]):
            j += 1
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        skip = SKIP.search(prev)
        code = textwrap.dedent("\n".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[start:j]))
        out.append(Block(lang, start + 1, code, skip.group(1) if skip else None))
        i = j + 1
    return out


def prose_lines(path: Path) -> list[str]:
    """The page's lines outside fenced blocks."""
    out, inside = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            out.append(line)
    return out


def sentences(lines: list[str]) -> list[str]:
    """Prose split into sentences, list items and table rows."""
    return [p for p in re.split(r"(?<=\.)\s+|\n\s*\n|\n(?=\s*(?:[-*|]|\d+\.) )", "\n".join(lines)) if p.strip()]


def commands(code: str) -> list[tuple[int, str]]:
    """(line offset, command) with backslash continuations joined."""
    out, start, parts = [], 0, []
    for k, line in enumerate(code.splitlines()):
        if not parts:
            start = k
        parts.append(line.rstrip().removesuffix("\\"))
        if not line.rstrip().endswith("\\"):
            out.append((start, " ".join(parts)))
            parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# -- 1. the examples run ----------------------------------------------------------------------------------
RUNNER = """
import sys
blocks = {blocks!r}
ns = {{"__name__": "__main__"}}
for where, code in blocks:
    print(f"--- {{where}}", flush=True)
    exec(compile(code, where, "exec"), ns)
"""


def python_pages() -> list[Path]:
    return [p for p in PAGES if any(b.lang == "python" for b in blocks(p))]


@pytest.mark.parametrize("page", python_pages(), ids=rel)
def test_python_examples_run(page: Path, tmp_path, request):
    found = [b for b in blocks(page) if b.lang == "python"]
    for b in found:
        if b.skip_reason is None:
            assert "docs-test" not in b.code, f"{rel(page)}:{b.line}: a skip marker must sit on the line before the block"
    runnable = [(f"{rel(page)}:{b.line}", b.code) for b in found if b.skip_reason is None]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if any("RADIXFLOW_URL" in code for _, code in runnable):
        server = request.getfixturevalue("server")
        env["RADIXFLOW_URL"] = server.url
        env["RADIXFLOW_API_KEY"] = server.api_key or ""
    script = tmp_path / "run_docs.py"
    script.write_text(RUNNER.format(blocks=runnable))
    work = tmp_path / "cwd"
    work.mkdir()
    r = subprocess.run(
        [sys.executable, str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S
    )
    assert r.returncode == 0, f"{rel(page)}: an example failed\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert r.stdout.count("--- ") == len(runnable)


def test_skips_are_rare_and_say_why():
    skipped = [(rel(p), b.line, b.skip_reason) for p in PAGES for b in blocks(p) if b.lang == "python" and b.skip_reason]
    total = sum(b.lang == "python" for p in PAGES for b in blocks(p))
    assert total >= 10, "the docs should show runnable examples"
    assert len(skipped) <= max(2, total // 8), f"too many skipped examples: {skipped}"
    for where, line, reason in skipped:
        assert len(reason.split()) >= 3, f"{where}:{line}: say why the example is skipped"


# -- 2. the flags exist ------------------------------------------------------------------------------------
def flag_uses() -> dict[str, set]:
    """{script path or "serve": {(flag, where)}} for every --flag the docs show."""
    uses: dict[str, set] = {}

    def scan(text: str, where: str) -> None:
        if OTHER_TOOL.match(text):
            return
        script = SCRIPT.search(text)
        owner = script.group(1) if script else "serve"
        for flag in FLAG.findall(text):
            uses.setdefault(owner, set()).add((flag, where))

    for page in PAGES:
        for b in blocks(page):
            if b.lang in ("python", "json"):
                continue
            for k, command in commands(b.code):
                scan(command, f"{rel(page)}:{b.line + k}")
        for sentence in sentences(prose_lines(page)):
            script = SCRIPT.search(sentence)  # prose: a sentence that names a script owns the flags it shows
            for span in INLINE_CODE.findall(sentence):
                scan(span if SCRIPT.search(span) or not script else f"{script.group(1)} {span}", rel(page))
    return uses


def help_flags(cmd: list[str]) -> set:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}"
    return set(FLAG.findall(r.stdout)) | {"help"}


def test_documented_flags_exist():
    uses = flag_uses()
    assert uses.get("serve"), "the docs show no radixflow serve flags"
    commands = {}
    for owner in sorted(uses):
        if owner == "serve":
            commands[owner] = [sys.executable, "-m", "radixflow", "serve", "--help"]
        elif owner in MODULES:
            pytest.importorskip(owner.split(".")[0])
            commands[owner] = [sys.executable, "-m", owner, "--help"]
        else:
            assert (ROOT / owner).is_file(), f"the docs run {owner}, which does not exist"
            commands[owner] = [sys.executable, str(ROOT / owner), "--help"]
    with ThreadPoolExecutor(max_workers=3) as pool:  # each --help is mostly a subprocess's imports
        known = dict(zip(commands, pool.map(help_flags, commands.values())))
    missing = [f"{where}: --{flag} is not in `{owner} --help`" for owner in commands
               for flag, where in sorted(uses[owner]) if flag not in known[owner]]
    assert not missing, "\n".join(missing)


# -- 3. the links resolve ----------------------------------------------------------------------------------
def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for line in prose_lines(page):
            for m in LINK.finditer(line):
                target = (m.group(1) or m.group(2)).split("#")[0]
                if re.match(r"^[a-z]+:", target):
                    continue
                anchor = (m.group(1) or m.group(2)).partition("#")[2]
                path = (page.parent / target).resolve() if target else page
                if not path.exists():
                    broken.append(f"{rel(page)}: {target} does not exist")
                elif ROOT not in path.parents and path != ROOT:
                    broken.append(f"{rel(page)}: {target} is outside the repository")
                elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                    broken.append(f"{rel(page)}: {path.name} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def anchors(path: Path) -> set:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    heads = [ln.lstrip("#").strip() for ln in prose_lines(path) if ln.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def test_docs_checker_sees_what_it_checks(tmp_path):
    """The parsers find blocks, skip markers, flags and links (else the tests above check nothing)."""
    md = tmp_path / "page.md"
    md.write_text(
        "See [a](missing.md).\n\n<!-- docs-test: skip: needs two GPUs here -->\n```python\nx = 1\n```\n\n"
        "```bash\nradixflow serve --tp-size 2\npython benchmarks/serving.py --request-rate 4\npip install --no-deps x\n"
        "python benchmarks/tp_bench.py \\\n    --tp 2\n```\n"
    )
    found = blocks(md)
    assert [b.lang for b in found] == ["python", "bash"]
    assert found[0].skip_reason == "needs two GPUs here" and found[0].code == "x = 1" and found[0].line == 5
    lines = found[1].code.splitlines()
    assert FLAG.findall(lines[0]) == ["tp-size"] and SCRIPT.search(lines[1]).group(1) == "benchmarks/serving.py"
    assert OTHER_TOOL.match(lines[2]) and not OTHER_TOOL.match(lines[0])
    assert commands(found[1].code)[3] == (3, "python benchmarks/tp_bench.py      --tp 2")
    assert [m.group(1) for m in LINK.finditer(prose_lines(md)[0])] == ["missing.md"]


def test_module_map_lists_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    mapped = set(re.findall(r"^\| `([\w/]+\.py)` \|", page, flags=re.M))
    modules = {str(p.relative_to(ROOT / "radixflow")) for p in (ROOT / "radixflow").rglob("*.py")}
    assert modules - mapped == set(), "add these modules to the module map in docs/architecture.md"
    assert mapped - modules == set(), "these modules in docs/architecture.md's map no longer exist"
